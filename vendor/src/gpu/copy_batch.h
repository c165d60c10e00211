// Private to gpu/: queues many copies on one stream with one runtime call
// where the runtime and driver can (cudaMemcpyBatchAsync, CUDA 12.8+),
// else one cudaMemcpyAsync each. A KV block is a few tens of KiB, so the
// per-call launch cost (microseconds) would otherwise rival the copy.
#pragma once

#if MC_WITH_CUDA

#include <cstddef>

#include "gpu/cuda_api.h"

namespace mcrs {
namespace gpu {

// Queues copies i < n of len[i] bytes from src[i] to dst[i] on `stream` (a
// stream the engine created, never the legacy default stream). Pointers are
// device memory or pinned host memory, so stream order holds for both ends.
// Nothing waits. The first failure of the batched call (an older driver)
// switches this process to single copies for good, logged once.
cudaError_t enqueue_copies(cudaStream_t stream, void **dst, const void **src, size_t *len, size_t n);

}  // namespace gpu
}  // namespace mcrs

#endif
