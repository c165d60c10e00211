// Copies between two GPUs of one process. With peer access (NVLink or PCIe
// P2P) the copy engines move bytes GPU to GPU; without it the runtime goes
// through host memory, which is several times slower, so the choice is made
// once per pair of devices and logged where operators will look for it.
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "gpu/copy_batch.h"
#include "gpu/cuda_api.h"
#include "gpu/gather_kernel.h"
#include "gpu/gpu.h"

namespace mcrs {
namespace gpu {

const char *peer_path_name(PeerPath p) {
    switch (p) {
        case PeerPath::SameDevice: return "same GPU";
        case PeerPath::Direct: return "direct peer path (GPU to GPU)";
        case PeerPath::Staged: return "no peer access (staged through host memory)";
    }
    return "?";
}

#if MC_WITH_CUDA

namespace {

// One slot per ordered pair, sized once from the device count. A slot is
// written once (under the mutex, which also serializes the probes) and read
// lock-free afterwards: every cross-GPU copy asks, the answer never changes.
struct PeerTable {
    explicit PeerTable(int devices)
        : n(devices), state(new std::atomic<int>[static_cast<size_t>(devices) * devices]) {
        for (size_t i = 0; i < static_cast<size_t>(n) * n; ++i) state[i].store(-1);
    }
    std::mutex mu;
    const int n;
    std::unique_ptr<std::atomic<int>[]> state;  // n*n: -1 unknown, else a PeerPath value
};

PeerTable &table(int device_count) {
    static PeerTable t(device_count);
    return t;
}

PeerPath probe(int from, int to) {
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess || !can) {
        cudaGetLastError();
        return PeerPath::Staged;
    }
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(from);
    cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
    cudaSetDevice(prev);
    if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // "already enabled" is sticky otherwise
        return PeerPath::Direct;
    }
    MC_LOG(Warn, "GPU " << from << " reports peer access to GPU " << to
                        << " but enabling it failed: " << cudaGetErrorString(e));
    cudaGetLastError();
    return PeerPath::Staged;
}

}  // namespace

PeerPath peer_path(int from, int to) {
    if (from == to) return PeerPath::SameDevice;
    const Status &s = status();
    if (!s.usable || from < 0 || to < 0 || from >= s.device_count || to >= s.device_count)
        return PeerPath::Staged;
    PeerTable &t = table(s.device_count);
    if (from >= t.n || to >= t.n) return PeerPath::Staged;
    std::atomic<int> &slot = t.state[static_cast<size_t>(from) * t.n + to];
    int known = slot.load(std::memory_order_acquire);
    if (known >= 0) return static_cast<PeerPath>(known);
    std::lock_guard<std::mutex> g(t.mu);
    known = slot.load(std::memory_order_relaxed);
    if (known < 0) {
        PeerPath p = probe(from, to);
        known = static_cast<int>(p);
        slot.store(known, std::memory_order_release);
        MC_LOG(Info, "GPU " << from << " -> GPU " << to << ": " << peer_path_name(p));
    }
    return static_cast<PeerPath>(known);
}

void copy_between(void *dst, int dst_device, const void *src, int src_device, size_t n) {
    if (dst_device < 0 || src_device < 0 || dst_device == src_device) return copy(dst, src, n);
    require_usable("GPU copy");
    // Peer access is per direction; a copy engine of either GPU may run it.
    PeerPath p = peer_path(src_device, dst_device);
    peer_path(dst_device, src_device);
    MC_LOG(Debug, "copy of " << n << " bytes GPU " << src_device << " -> GPU " << dst_device << ": "
                             << peer_path_name(p));
    cudaError_t e = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess) {
        cudaGetLastError();
        throw Error(kErrContext, "cudaMemcpyPeer of " + std::to_string(n) + " bytes from GPU " +
                                     std::to_string(src_device) + " to GPU " + std::to_string(dst_device) +
                                     " failed: " + cudaGetErrorString(e));
    }
}

namespace {

// A stream of this thread for batched copies on `device` (the batched call
// refuses the legacy default stream).
cudaStream_t batch_stream(int device) {
    struct Streams {
        std::vector<cudaStream_t> s;
        ~Streams() {
            for (auto x : s)
                if (x) cudaStreamDestroy(x);
        }
    };
    thread_local Streams t;
    if (device < 0) return nullptr;
    if (t.s.size() <= static_cast<size_t>(device)) t.s.resize(static_cast<size_t>(device) + 1, nullptr);
    cudaStream_t &st = t.s[static_cast<size_t>(device)];
    if (!st) {
        cudaSetDevice(device);
        if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            st = nullptr;
        }
    }
    return st;
}

}  // namespace

void copy_many(const CopyPiece *p, size_t count) {
    if (count == 0) return;
    require_usable("GPU copy");
    // Merge pieces that continue the previous one on both sides.
    thread_local std::vector<CopyPiece> run;
    run.clear();
    bool one_device = true;  // every piece GPU d -> GPU d, for one d
    for (size_t i = 0; i < count; ++i) {
        const CopyPiece &c = p[i];
        if (c.n == 0) continue;
        one_device = one_device && c.dst_device >= 0 && c.dst_device == c.src_device &&
                     (run.empty() || run[0].dst_device == c.dst_device);
        if (!run.empty()) {
            CopyPiece &b = run.back();
            if (c.dst_device == b.dst_device && c.src_device == b.src_device &&
                static_cast<char *>(b.dst) + b.n == c.dst && static_cast<const char *>(b.src) + b.n == c.src) {
                b.n += c.n;
                continue;
            }
        }
        run.push_back(c);
    }
    if (run.empty()) return;
    cudaError_t e = cudaSuccess;
    cudaStream_t stream = one_device ? batch_stream(run[0].dst_device) : nullptr;
    if (stream) {
        // Every piece is on one GPU: small ones may go through the gather
        // kernel (copy_batch.h).
        const int device = run[0].dst_device;
        // As few batched calls as order allows: a piece that depends on an
        // earlier one (same bytes written, or read after a write) starts
        // a new call, queued after the previous one on the stream.
        thread_local CopyBatch batch;
        for (size_t i = 0; i < run.size() && e == cudaSuccess; ++i) {
            if (batch.add(run[i].dst, run[i].src, run[i].n)) continue;
            e = batch.flush(stream, device);
            batch.add(run[i].dst, run[i].src, run[i].n);
        }
        if (e == cudaSuccess) e = batch.flush(stream, device);
        batch.clear();
    } else {
        stream = cudaStreamPerThread;
        for (size_t i = 0; i < run.size() && e == cudaSuccess; ++i) {
            const CopyPiece &c = run[i];
            if (c.dst_device < 0 || c.src_device < 0 || c.dst_device == c.src_device) {
                e = cudaMemcpyAsync(c.dst, c.src, c.n, cudaMemcpyDefault, stream);
            } else {
                peer_path(c.src_device, c.dst_device);
                peer_path(c.dst_device, c.src_device);
                e = cudaMemcpyPeerAsync(c.dst, c.dst_device, c.src, c.src_device, c.n, stream);
            }
        }
    }
    // One wait for the whole batch, also after a failed enqueue (copies
    // already queued may still be running).
    cudaError_t s = cudaStreamSynchronize(stream);
    if (e == cudaSuccess) e = s;
    if (e != cudaSuccess) {
        cudaGetLastError();
        throw Error(kErrContext, "batched GPU copy (" + std::to_string(count) + " pieces, " +
                                     std::to_string(run.size()) + " copies) failed: " + cudaGetErrorString(e));
    }
}

void copy_blocks(const BlockCopyRegion *r, size_t nr, const uint64_t *dst_ids, const uint64_t *src_ids,
                 size_t nb) {
    if (nr == 0 || nb == 0) return;
    require_usable("GPU copy");
    const int device = r[0].dst_device;
    bool kernel = device >= 0 && nr * nb > 1;
    for (size_t i = 0; i < nr && kernel; ++i)
        kernel = r[i].dst_device == device && r[i].src_device == device && blocks_eligible(r[i]);
    cudaStream_t stream = kernel ? batch_stream(device) : nullptr;
    if (stream) {
        cudaError_t e = launch_blocks(stream, device, r, nr, dst_ids, src_ids, nb);
        if (e != cudaErrorNotSupported) {
            cudaError_t s = cudaStreamSynchronize(stream);  // also after a failed launch
            if (e == cudaSuccess) e = s;
            if (e != cudaSuccess) {
                cudaGetLastError();
                throw Error(kErrContext, "GPU block-list copy (" + std::to_string(nr) + " regions x " +
                                             std::to_string(nb) + " blocks) failed: " + cudaGetErrorString(e));
            }
            return;
        }
    }
    // Mixed devices, host memory, unaligned blocks or no kernel: piece by
    // piece, batched.
    thread_local std::vector<CopyPiece> pieces;
    pieces.clear();
    pieces.reserve(nr * nb);
    for (size_t i = 0; i < nr; ++i)
        for (size_t k = 0; k < nb; ++k)
            pieces.push_back(CopyPiece{reinterpret_cast<void *>(r[i].dst + dst_ids[k] * r[i].dst_stride),
                                       r[i].dst_device,
                                       reinterpret_cast<const void *>(r[i].src + src_ids[k] * r[i].src_stride),
                                       r[i].src_device, static_cast<size_t>(r[i].n)});
    struct Shrink {  // a huge list's pieces do not stay with the thread
        ~Shrink() {
            if (pieces.capacity() > (size_t(16) << 20) / sizeof(CopyPiece)) std::vector<CopyPiece>().swap(pieces);
        }
    } shrink;
    copy_many(pieces.data(), pieces.size());
}

#else  // CPU build

PeerPath peer_path(int from, int to) { return from == to ? PeerPath::SameDevice : PeerPath::Staged; }
void copy_between(void *dst, int, const void *src, int, size_t n) { copy(dst, src, n); }
void copy_many(const CopyPiece *, size_t count) {
    if (count) require_usable("GPU copy");
}
void copy_blocks(const BlockCopyRegion *, size_t nr, const uint64_t *, const uint64_t *, size_t nb) {
    if (nr && nb) require_usable("GPU copy");
}

#endif

}  // namespace gpu
}  // namespace mcrs
