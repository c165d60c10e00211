#include "gpu/copy_batch.h"

#if MC_WITH_CUDA

#include <atomic>

#include "common/log.h"
#include "gpu/gather_kernel.h"

// cuda.h (from the toolkit or runtime package the build uses) says which
// runtime is linked; the batched call exists from 12.8 on.
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12080
#define MC_HAVE_MEMCPY_BATCH 1
#else
#define MC_HAVE_MEMCPY_BATCH 0
#endif

namespace mcrs {
namespace gpu {

namespace {

// -1 untried, 1 works, 0 unsupported by this driver.
std::atomic<int> g_batch_api{MC_HAVE_MEMCPY_BATCH ? -1 : 0};

#if MC_HAVE_MEMCPY_BATCH
cudaError_t batched(cudaStream_t stream, void **dst, const void **src, size_t *len, size_t n) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_idx = 0;  // one attribute set, from copy 0 on
#if MC_CUDA_MAJOR >= 13
    return cudaMemcpyBatchAsync(dst, src, len, n, &attr, &attr_idx, 1, stream);
#else
    size_t fail_idx = 0;
    return cudaMemcpyBatchAsync(dst, const_cast<void **>(src), len, n, &attr, &attr_idx, 1, &fail_idx, stream);
#endif
}
#endif

bool unsupported(cudaError_t e) {
    return e == cudaErrorNotSupported || e == cudaErrorCallRequiresNewerDriver || e == cudaErrorInsufficientDriver;
}

}  // namespace

namespace {

// Small device-to-device pieces through the gather kernel, the rest left
// in place (compacted to the front) for the copy calls. Returns the number
// left.
size_t gather_small(cudaStream_t stream, int device, void **dst, const void **src, size_t *len, size_t n,
                    cudaError_t &e) {
    thread_local std::vector<void *> kd;
    thread_local std::vector<const void *> ks;
    thread_local std::vector<size_t> kl;
    kd.clear();
    ks.clear();
    kl.clear();
    for (size_t i = 0; i < n; ++i) {
        if (!gather_eligible(dst[i], src[i], len[i])) continue;
        kd.push_back(dst[i]);
        ks.push_back(src[i]);
        kl.push_back(len[i]);
    }
    if (kd.size() < 2) return n;  // one piece: a plain copy is as fast
    e = launch_gather(stream, device, kd.data(), ks.data(), kl.data(), kd.size());
    if (e == cudaErrorNotSupported) {
        e = cudaSuccess;
        return n;
    }
    if (e != cudaSuccess) return 0;
    size_t left = 0;
    for (size_t i = 0; i < n; ++i) {
        if (gather_eligible(dst[i], src[i], len[i])) continue;
        dst[left] = dst[i];
        src[left] = src[i];
        len[left] = len[i];
        ++left;
    }
    return left;
}

}  // namespace

cudaError_t enqueue_copies(cudaStream_t stream, void **dst, const void **src, size_t *len, size_t n,
                           int gather_device) {
    if (n == 0) return cudaSuccess;
    if (gather_device >= 0 && n > 1) {
        cudaError_t e = cudaSuccess;
        n = gather_small(stream, gather_device, dst, src, len, n, e);
        if (e != cudaSuccess || n == 0) return e;
    }
#if MC_HAVE_MEMCPY_BATCH
    if (n > 1 && g_batch_api.load(std::memory_order_relaxed) != 0) {
        cudaError_t e = batched(stream, dst, src, len, n);
        if (e == cudaSuccess) {
            g_batch_api.store(1, std::memory_order_relaxed);
            return e;
        }
        cudaGetLastError();
        if (unsupported(e) && g_batch_api.exchange(0) != 0)
            MC_LOG(Info, "GPU: batched copies unavailable (" << cudaGetErrorString(e)
                                                             << "); copying one request at a time");
        // Either way these copies go one by one below. Whatever the failed
        // call may have queued runs again after it, in stream order: the
        // copies of a batch are independent, so a second run of one writes
        // the same bytes.
    }
#endif
    for (size_t i = 0; i < n; ++i) {
        cudaError_t e = cudaMemcpyAsync(dst[i], src[i], len[i], cudaMemcpyDefault, stream);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

bool CopyBatch::depends(uintptr_t dlo, uintptr_t dhi, uintptr_t slo, uintptr_t shi) const {
    // Cheap bounds first (KV blocks arrive in address order): only a piece
    // inside the bounds is compared with every gathered one.
    const bool d_check = !exempted(dlo, dhi) && (written_.hits(dlo, dhi) || read_.hits(dlo, dhi));
    const bool s_check = !exempted(slo, shi) && written_.hits(slo, shi);
    if (!d_check && !s_check) return false;
    for (size_t i = 0; i < len_.size(); ++i) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(dst_[i]), b = a + len_[i];
        const uintptr_t c = reinterpret_cast<uintptr_t>(src_[i]), d = c + len_[i];
        if (d_check && ((dlo < b && a < dhi) || (dlo < d && c < dhi))) return true;
        if (s_check && slo < b && a < shi) return true;
    }
    return false;
}

bool CopyBatch::add(void *dst, const void *src, size_t n) {
    if (n == 0) return true;
    const uintptr_t dlo = reinterpret_cast<uintptr_t>(dst), slo = reinterpret_cast<uintptr_t>(src);
    if (depends(dlo, dlo + n, slo, slo + n)) return false;
    if (!exempted(dlo, dlo + n)) written_.take(dlo, dlo + n);
    if (!exempted(slo, slo + n)) read_.take(slo, slo + n);
    bytes_ += n;
    if (!len_.empty() && static_cast<char *>(dst_.back()) + len_.back() == dst &&
        static_cast<const char *>(src_.back()) + len_.back() == src) {
        len_.back() += n;  // continues the previous piece on both sides
        return true;
    }
    dst_.push_back(dst);
    src_.push_back(src);
    len_.push_back(n);
    return true;
}

cudaError_t CopyBatch::flush(cudaStream_t stream, int gather_device) {
    cudaError_t e = enqueue_copies(stream, dst_.data(), src_.data(), len_.data(), len_.size(), gather_device);
    clear();
    return e;
}

void CopyBatch::clear() {
    dst_.clear();
    src_.clear();
    len_.clear();
    bytes_ = 0;
    written_ = Box();
    read_ = Box();
}

}  // namespace gpu
}  // namespace mcrs

#endif
