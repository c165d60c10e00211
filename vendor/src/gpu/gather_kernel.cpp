#include "gpu/gather_kernel.h"

#if MC_WITH_CUDA

#include <cstdint>
#include <mutex>
#include <vector>

#include "common/log.h"

namespace mcrs {
namespace gpu {

namespace {

// mc_gather16(table, n): table holds n entries {dst, src, len} of 64-bit
// words. Block b copies pieces b, b + gridDim, ...; its threads move 16
// bytes each per step.
// mc_blocks16(regions, ids, nblocks, total): the same walk over the
// total = regions x nblocks pieces of a block list; piece p is block
// p % nblocks of region p / nblocks. A region is {dst, src, dst_stride,
// src_stride, len} and an id pair {dst_id, src_id}, 64-bit words, so the
// table is per region and per block, not per piece, and each thread
// computes its piece's addresses. PTX ISA 7.0 for sm_70 is accepted by every driver
// that runs CUDA 12, and the driver compiles it for the GPU at hand.
const char kGatherPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry mc_gather16(
    .param .u64 p_table,
    .param .u32 p_n
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b32 %v<4>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd0, [p_table];
    ld.param.u32 %r0, [p_n];
    cvta.to.global.u64 %rd0, %rd0;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %nctaid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
    mul.wide.u32 %rd1, %r3, 16;
    mul.wide.u32 %rd2, %r4, 16;
PIECE:
    setp.ge.u32 %p0, %r1, %r0;
    @%p0 bra DONE;
    mul.wide.u32 %rd3, %r1, 24;
    add.u64 %rd3, %rd0, %rd3;
    ld.global.u64 %rd4, [%rd3];
    ld.global.u64 %rd5, [%rd3+8];
    ld.global.u64 %rd6, [%rd3+16];
    cvta.to.global.u64 %rd4, %rd4;
    cvta.to.global.u64 %rd5, %rd5;
    mov.u64 %rd7, %rd1;
CHUNK:
    setp.ge.u64 %p1, %rd7, %rd6;
    @%p1 bra NEXT;
    add.u64 %rd8, %rd5, %rd7;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd8];
    add.u64 %rd9, %rd4, %rd7;
    st.global.v4.u32 [%rd9], {%v0, %v1, %v2, %v3};
    add.u64 %rd7, %rd7, %rd2;
    bra CHUNK;
NEXT:
    add.u32 %r1, %r1, %r2;
    bra PIECE;
DONE:
    ret;
}
)";

// A module of its own, so that one kernel the driver refuses leaves the
// other in service.
const char kBlocksPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry mc_blocks16(
    .param .u64 p_regions,
    .param .u64 p_ids,
    .param .u32 p_nblocks,
    .param .u32 p_total
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<10>;
    .reg .b32 %v<4>;
    .reg .b64 %rd<20>;

    ld.param.u64 %rd0, [p_regions];
    ld.param.u64 %rd1, [p_ids];
    ld.param.u32 %r0, [p_nblocks];
    ld.param.u32 %r5, [p_total];
    cvta.to.global.u64 %rd0, %rd0;
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %nctaid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
    mul.wide.u32 %rd2, %r3, 16;
    mul.wide.u32 %rd3, %r4, 16;
PIECE:
    setp.ge.u32 %p0, %r1, %r5;
    @%p0 bra DONE;
    div.u32 %r6, %r1, %r0;
    mul.lo.u32 %r7, %r6, %r0;
    sub.u32 %r7, %r1, %r7;
    mul.wide.u32 %rd4, %r6, 40;
    add.u64 %rd4, %rd0, %rd4;
    ld.global.u64 %rd5, [%rd4];
    ld.global.u64 %rd6, [%rd4+8];
    ld.global.u64 %rd7, [%rd4+16];
    ld.global.u64 %rd8, [%rd4+24];
    ld.global.u64 %rd9, [%rd4+32];
    mul.wide.u32 %rd10, %r7, 16;
    add.u64 %rd10, %rd1, %rd10;
    ld.global.u64 %rd11, [%rd10];
    ld.global.u64 %rd12, [%rd10+8];
    mad.lo.u64 %rd5, %rd11, %rd7, %rd5;
    mad.lo.u64 %rd6, %rd12, %rd8, %rd6;
    cvta.to.global.u64 %rd5, %rd5;
    cvta.to.global.u64 %rd6, %rd6;
    mov.u64 %rd13, %rd2;
BCHUNK:
    setp.ge.u64 %p1, %rd13, %rd9;
    @%p1 bra BNEXT;
    add.u64 %rd14, %rd6, %rd13;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd14];
    add.u64 %rd15, %rd5, %rd13;
    st.global.v4.u32 [%rd15], {%v0, %v1, %v2, %v3};
    add.u64 %rd13, %rd13, %rd3;
    bra BCHUNK;
BNEXT:
    add.u32 %r1, %r1, %r2;
    bra PIECE;
DONE:
    ret;
}
)";

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = 16384;

// Loaded once per process; the library stays loaded for its lifetime.
struct Kernels {
    cudaKernel_t gather = nullptr;
    cudaKernel_t blocks = nullptr;
};

cudaKernel_t load(const char *ptx, const char *name, const char *otherwise) {
    cudaLibrary_t lib = nullptr;
    cudaKernel_t k = nullptr;
    cudaError_t e = cudaLibraryLoadData(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e == cudaSuccess) e = cudaLibraryGetKernel(&k, lib, name);
    if (e == cudaSuccess) return k;
    cudaGetLastError();
    MC_LOG(Info, "GPU: kernel " << name << " unavailable (" << cudaGetErrorString(e) << "); " << otherwise);
    return nullptr;
}

const Kernels &kernels() {
    static std::once_flag once;
    static Kernels k;
    std::call_once(once, [] {
        k.gather = load(kGatherPtx, "mc_gather16", "small GPU copies go one by one");
        k.blocks = load(kBlocksPtx, "mc_blocks16", "GPU block lists go piece by piece");
    });
    return k;
}

// This thread's piece table on each GPU, grown on demand. Its previous
// contents may still be read by a queued launch: growing waits for the
// stream first; refilling is ordered after that launch by the stream.
struct Table {
    void *dev = nullptr;
    size_t cap = 0;
};
struct Tables {
    std::vector<Table> per_device;
    ~Tables() {
        for (auto &t : per_device)
            if (t.dev) cudaFree(t.dev);
    }
};

cudaError_t device_table(int device, size_t bytes, cudaStream_t stream, void *&out) {
    thread_local Tables tables;
    if (tables.per_device.size() <= static_cast<size_t>(device))
        tables.per_device.resize(static_cast<size_t>(device) + 1);
    Table &t = tables.per_device[static_cast<size_t>(device)];
    if (t.cap < bytes) {
        if (t.dev) {
            cudaError_t e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess) return e;
            cudaFree(t.dev);
            t.dev = nullptr;
            t.cap = 0;
        }
        size_t cap = bytes < 64 * 1024 ? 64 * 1024 : bytes * 2;
        cudaError_t e = cudaMalloc(&t.dev, cap);
        if (e != cudaSuccess) {
            t.dev = nullptr;
            return e;
        }
        t.cap = cap;
    }
    out = t.dev;
    return cudaSuccess;
}

}  // namespace

bool gather_eligible(const void *dst, const void *src, size_t n) {
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    return n > 0 && n <= kGatherMaxPiece && ((d | s | n) & 15) == 0;
}

cudaError_t launch_gather(cudaStream_t stream, int device, void *const *dst, const void *const *src, const size_t *len,
                          size_t n) {
    if (n == 0) return cudaSuccess;
    if (n > UINT32_MAX) return cudaErrorInvalidValue;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return e;
    cudaKernel_t k = kernels().gather;
    if (!k) return cudaErrorNotSupported;
    // The table goes from pageable memory: the runtime has copied it out
    // before cudaMemcpyAsync returns, so this buffer may be refilled at once.
    thread_local std::vector<uint64_t> host;
    host.resize(3 * n);
    for (size_t i = 0; i < n; ++i) {
        host[3 * i] = reinterpret_cast<uintptr_t>(dst[i]);
        host[3 * i + 1] = reinterpret_cast<uintptr_t>(src[i]);
        host[3 * i + 2] = len[i];
    }
    const size_t bytes = host.size() * sizeof(uint64_t);
    void *table = nullptr;
    e = device_table(device, bytes, stream, table);
    if (e == cudaSuccess) e = cudaMemcpyAsync(table, host.data(), bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return e;
    uint64_t table_arg = reinterpret_cast<uintptr_t>(table);
    uint32_t n_arg = static_cast<uint32_t>(n);
    void *args[] = {&table_arg, &n_arg};
    const dim3 grid{static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks), 1, 1};
    const dim3 block{kThreads, 1, 1};
    return cudaLaunchKernel(reinterpret_cast<const void *>(k), grid, block, args, 0, stream);
}

bool blocks_eligible(const BlockCopyRegion &r) {
    return r.n > 0 && r.n <= kGatherMaxPiece && ((r.dst | r.src | r.dst_stride | r.src_stride | r.n) & 15) == 0;
}

cudaError_t launch_blocks(cudaStream_t stream, int device, const BlockCopyRegion *regions, size_t num_regions,
                          const uint64_t *dst_ids, const uint64_t *src_ids, size_t num_blocks) {
    if (num_regions == 0 || num_blocks == 0) return cudaSuccess;
    const size_t total = num_regions * num_blocks;
    if (num_blocks > UINT32_MAX || total / num_blocks != num_regions || total > UINT32_MAX)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return e;
    cudaKernel_t k = kernels().blocks;
    if (!k) return cudaErrorNotSupported;
    // One upload: the regions (5 words each), then the id pairs (2 each).
    thread_local std::vector<uint64_t> host;
    host.resize(5 * num_regions + 2 * num_blocks);
    uint64_t *h = host.data();
    for (size_t i = 0; i < num_regions; ++i, h += 5) {
        const BlockCopyRegion &r = regions[i];
        h[0] = r.dst;
        h[1] = r.src;
        h[2] = r.dst_stride;
        h[3] = r.src_stride;
        h[4] = r.n;
    }
    for (size_t i = 0; i < num_blocks; ++i, h += 2) {
        h[0] = dst_ids[i];
        h[1] = src_ids[i];
    }
    const size_t bytes = host.size() * sizeof(uint64_t);
    void *table = nullptr;
    e = device_table(device, bytes, stream, table);
    if (e == cudaSuccess) e = cudaMemcpyAsync(table, host.data(), bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return e;
    // The upload has been copied out of `host`: a huge list's table does not
    // stay with the thread.
    if (host.capacity() > (size_t(16) << 20) / sizeof(uint64_t)) std::vector<uint64_t>().swap(host);
    uint64_t regions_arg = reinterpret_cast<uintptr_t>(table);
    uint64_t ids_arg = regions_arg + 5 * num_regions * sizeof(uint64_t);
    uint32_t nblocks_arg = static_cast<uint32_t>(num_blocks);
    uint32_t total_arg = static_cast<uint32_t>(total);
    void *args[] = {&regions_arg, &ids_arg, &nblocks_arg, &total_arg};
    const dim3 grid{static_cast<unsigned>(total < kMaxBlocks ? total : kMaxBlocks), 1, 1};
    const dim3 block{kThreads, 1, 1};
    return cudaLaunchKernel(reinterpret_cast<const void *>(k), grid, block, args, 0, stream);
}

}  // namespace gpu
}  // namespace mcrs

#endif
