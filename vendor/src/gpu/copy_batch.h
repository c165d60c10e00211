// Private to gpu/: many small copies on one stream with as few runtime
// calls as order allows. A KV block is a few tens of KiB, so the per-call
// launch cost (microseconds) would otherwise rival the copy.
#pragma once

#if MC_WITH_CUDA

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/cuda_api.h"

namespace mcrs {
namespace gpu {

// Queues copies i < n of len[i] bytes from src[i] to dst[i] on `stream` (a
// stream the engine created, never the legacy default stream), with one
// cudaMemcpyBatchAsync (runtime 12.8+ and a driver that has it) or one
// cudaMemcpyAsync each. Copies of one call may run in any order: callers
// never pass copies that depend on each other (CopyBatch splits them).
// Pointers are device or pinned host memory. With `gather_device` >= 0
// (every pointer is memory that GPU can address at that address: its own
// or a mapped peer's memory, or pinned host memory mapped into its address
// space; `stream` is one of its streams) small aligned pieces go as one
// gather-kernel launch instead (gather_kernel.h). Reorders the arrays. Nothing waits.
cudaError_t enqueue_copies(cudaStream_t stream, void **dst, const void **src, size_t *len, size_t n,
                           int gather_device = -1);

// Copies gathered for enqueue_copies. A copy that continues the previous
// one on both sides extends it; a copy that depends on a gathered one (it
// writes what another reads or writes, or reads what another writes)
// must wait for the gathered ones to be queued first: add() then returns
// false and the caller calls flush() before adding it again. Ranges inside
// the `exempt` range (a staging buffer whose slots never overlap within a
// batch) are not checked.
class CopyBatch {
public:
    void exempt(const void *base, size_t n) {
        ex_lo_ = reinterpret_cast<uintptr_t>(base);
        ex_hi_ = ex_lo_ + n;
    }
    bool add(void *dst, const void *src, size_t n);
    cudaError_t flush(cudaStream_t stream, int gather_device = -1);
    void clear();  // drops what is gathered
    bool empty() const { return len_.empty(); }
    size_t bytes() const { return bytes_; }
    size_t copies() const { return len_.size(); }

private:
    struct Box {
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        bool hits(uintptr_t a, uintptr_t b) const { return a < hi && lo < b; }
        void take(uintptr_t a, uintptr_t b) {
            if (a < lo) lo = a;
            if (b > hi) hi = b;
        }
    };
    bool exempted(uintptr_t a, uintptr_t b) const { return a >= ex_lo_ && b <= ex_hi_; }
    bool depends(uintptr_t dlo, uintptr_t dhi, uintptr_t slo, uintptr_t shi) const;

    std::vector<void *> dst_;
    std::vector<const void *> src_;
    std::vector<size_t> len_;
    size_t bytes_ = 0;
    Box written_, read_;  // bounds of the checked ranges gathered so far
    uintptr_t ex_lo_ = 0, ex_hi_ = 0;
};

}  // namespace gpu
}  // namespace mcrs

#endif
