#include "gpu/copy_batch.h"

#if MC_WITH_CUDA

#include <atomic>

#include "common/log.h"

namespace mcrs {
namespace gpu {

namespace {

// -1 untried, 1 works, 0 unsupported here.
std::atomic<int> g_batch_api{-1};

cudaError_t batched(cudaStream_t stream, void **dst, const void **src, size_t *len, size_t n) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_idx = 0;  // one attribute set for every copy
#if MC_CUDA_MAJOR >= 13
    return cudaMemcpyBatchAsync(dst, src, len, n, &attr, &attr_idx, 1, stream);
#else
    size_t fail_idx = 0;
    return cudaMemcpyBatchAsync(dst, const_cast<void **>(src), len, n, &attr, &attr_idx, 1, &fail_idx, stream);
#endif
}

}  // namespace

cudaError_t enqueue_copies(cudaStream_t stream, void **dst, const void **src, size_t *len, size_t n) {
    if (n == 0) return cudaSuccess;
    if (n > 1 && g_batch_api.load(std::memory_order_relaxed) != 0) {
        cudaError_t e = batched(stream, dst, src, len, n);
        if (e == cudaSuccess) {
            g_batch_api.store(1, std::memory_order_relaxed);
            return e;
        }
        cudaGetLastError();
        if (g_batch_api.exchange(0) != 0)
            MC_LOG(Info, "GPU: batched copies unavailable (" << cudaGetErrorString(e)
                                                             << "); copying one request at a time");
        // Copies are idempotent: whatever the failed call may have queued
        // is simply done again below, in stream order.
    }
    for (size_t i = 0; i < n; ++i) {
        cudaError_t e = cudaMemcpyAsync(dst[i], src[i], len[i], cudaMemcpyDefault, stream);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

}  // namespace gpu
}  // namespace mcrs

#endif
