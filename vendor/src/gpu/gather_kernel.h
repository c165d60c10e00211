// Private to gpu/: many small device-to-device copies as one kernel launch.
// A copy engine pays a few microseconds per copy whatever its size, so a
// scattered KV pull of 32 KiB blocks through a CUDA IPC mapping ran at a
// tenth of the contiguous speed; one kernel that walks a table of pieces
// moves them at memory speed. The kernel is PTX text JIT-compiled by the
// driver on first use (no CUDA compiler at build time); where that fails
// the caller copies as before.
#pragma once

#if MC_WITH_CUDA

#include <cstddef>
#include <cstdint>

#include "gpu/gpu.h"

#include "gpu/cuda_api.h"

namespace mcrs {
namespace gpu {

// Pieces at most this long may go through the kernel; longer ones keep the
// copy engines (as fast for them, and they leave the SMs to the model).
constexpr size_t kGatherMaxPiece = 1 << 20;

// Whether a piece may go through the kernel: 16-byte aligned on both sides,
// a multiple of 16 bytes long, at most kGatherMaxPiece.
bool gather_eligible(const void *dst, const void *src, size_t n);

// Queues pieces i < n (each gather_eligible, device memory that `device`
// can address, independent of each other) as one kernel launch on
// `stream`, a stream of `device`. Returns cudaErrorNotSupported, having
// queued nothing, when the kernel cannot be loaded on this machine (logged
// once); the caller then copies another way. Nothing waits.
cudaError_t launch_gather(cudaStream_t stream, int device, void *const *dst, const void *const *src, const size_t *len,
                          size_t n);

// Whether a block-list region may go through the block kernel: bases,
// strides and length 16-byte aligned, the length at most kGatherMaxPiece.
bool blocks_eligible(const BlockCopyRegion &r);

// Queues every block of a block list (gpu.h: copy_blocks; every region
// blocks_eligible, on `device`, pieces independent of each other) as one
// kernel launch on `stream`. Host work is per region and per block id,
// not per piece. cudaErrorNotSupported (nothing queued) when the kernel
// cannot be loaded. Nothing waits.
cudaError_t launch_blocks(cudaStream_t stream, int device, const BlockCopyRegion *regions, size_t num_regions,
                          const uint64_t *dst_ids, const uint64_t *src_ids, size_t num_blocks);

}  // namespace gpu
}  // namespace mcrs

#endif
