// GPU support behind one CUDA-free interface. In a CPU build (MC_WITH_CUDA
// unset) every call exists and reports that the engine was built without
// CUDA; in a CUDA build with no usable GPU or driver, calls fail with a
// message naming the build's CUDA major and the driver's version. Host
// memory keeps working either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/socket.h"

namespace mcrs {
namespace gpu {

// 12 or 13, or 0 for a CPU build.
int build_major();

struct Status {
    bool usable = false;
    int device_count = 0;
    int driver_version = 0;   // e.g. 13000; 0 when there is no driver
    int runtime_version = 0;  // the statically linked runtime, e.g. 12090
    std::string reason;       // why not usable
};
// Probed once, on first use.
const Status &status();
// Throws Error(kErrNotImplemented/kErrContext) with status().reason when the
// GPU path is unusable.
void require_usable(const char *what);

// Where a pointer lives: device memory of GPU `device`, or host memory.
struct PointerKind {
    bool device = false;
    int ordinal = -1;
};
PointerKind classify(const void *ptr);

// Synchronous copy in any direction (unified addressing). Throws Error.
void copy(void *dst, const void *src, size_t n);

// How bytes move between two GPUs of this process.
enum class PeerPath {
    SameDevice,  // one GPU: its copy engines
    Direct,      // peer access enabled (NVLink or PCIe P2P): GPU to GPU
    Staged,      // no peer access: the runtime stages through host memory
};
const char *peer_path_name(PeerPath p);
// Enables peer access from `from` to `to` (both directions are asked for
// separately) the first time a pair is seen and remembers the answer; the
// first use of each pair is logged. Never throws.
PeerPath peer_path(int from, int to);
// A synchronous copy between memory that may live on two GPUs (device -1 =
// host memory): uses the direct peer path when it exists. Throws Error.
void copy_between(void *dst, int dst_device, const void *src, int src_device, size_t n);
// One piece of a batched copy (device -1 = host memory).
struct CopyPiece {
    void *dst;
    int dst_device;
    const void *src;
    int src_device;
    size_t n;
};
// Copies every piece like copy_between, but queued on one stream with one
// wait at the end instead of one per piece; pieces that continue the
// previous one on both sides are merged into one copy. Throws Error (the
// pieces' bytes are then unspecified).
void copy_many(const CopyPiece *pieces, size_t count);
// One region of a block-list copy: block k is `n` bytes at dst + k *
// dst_stride and src + k * src_stride (64-bit wrapping arithmetic, so a
// base may lie below the memory when the lowest id is above 0; callers
// check that every block named lies inside memory they may touch).
struct BlockCopyRegion {
    uint64_t dst, src, dst_stride, src_stride, n;
    int dst_device, src_device;  // -1 = host memory
};
// Copies block dst_ids[i] <- src_ids[i] of every region, for i < num_blocks.
// Where every region lies on one GPU with 16-byte alignment, as one kernel
// launch whose table is per region and per id (no per-piece host work);
// otherwise piece by piece through copy_many. Pieces must not overlap each
// other's destinations. Synchronous; throws Error.
void copy_blocks(const BlockCopyRegion *regions, size_t num_regions, const uint64_t *dst_ids,
                 const uint64_t *src_ids, size_t num_blocks);
void memset_device(void *dst, int value, size_t n, int device);
void *alloc_device(int device, size_t n);
void free_device(void *ptr, int device);
void *alloc_pinned(size_t n);
void free_pinned(void *ptr);

// TCP with device memory: pipelined through pinned staging buffers.
IoResult send_from_device(int fd, const void *dev, size_t n, int device, std::string &err);
IoResult recv_into_device(int fd, void *dev, size_t n, int device, std::string &err);

// Staging for runs of small TCP requests with GPU memory (KV blocks): a
// pinned buffer in two halves and one stream. Copies between a half and
// device memory are queued (a piece that continues the previous one on
// both sides extends it) and issued together, as one batched call; the
// user waits on a half before its bytes are read (copies from the device)
// or overwritten (copies to the device). One thread at a time; the buffer,
// stream and events come with the first ready().
class StageRing {
public:
    StageRing();
    ~StageRing();
    StageRing(const StageRing &) = delete;
    StageRing &operator=(const StageRing &) = delete;

    // Bytes per half.
    static constexpr size_t kHalfBytes = size_t(2) << 20;
    // Requests up to this size are staged in batches; larger ones go
    // through the chunked pipeline (send_from_device / recv_into_device).
    static constexpr size_t kMaxPiece = kHalfBytes / 2;

    // Set up for GPU `device` (once; a ring serves one device). false with
    // `err` when CUDA cannot, or when the ring already serves another device:
    // the caller then takes the unbatched path.
    bool ready(int device, std::string &err);
    char *half(int h) const;
    // Queues a copy (device memory <-> this ring's halves).
    void queue(void *dst, const void *src, size_t n);
    size_t queued_bytes() const;
    // Issues what is queued and marks half `h`: wait(h) returns once every
    // copy issued so far has finished.
    bool issue(int h, std::string &err);
    bool wait(int h, std::string &err);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// CUDA IPC for the same-host path.
struct IpcExport {
    std::string handle_hex;  // 128 hex digits
    uint64_t offset = 0;     // of the pointer inside its allocation
    int device = -1;
};
bool ipc_export(const void *ptr, IpcExport &out, std::string &err);
// A peer allocation mapped into this process: `size` is what the driver
// mapped, the bound for every offset the peer's descriptor names.
struct IpcMapping {
    void *base = nullptr;
    int device = -1;  // the local GPU it is mapped on
    uint64_t size = 0;
};
// Maps a peer's allocation (on `device` when this process sees that GPU,
// else on GPU 0), or returns false with `err`. A process maps an allocation
// once: opening a handle it holds returns the same mapping and counts; each
// successful open needs an ipc_close.
bool ipc_open(const std::string &handle_hex, int device, IpcMapping &out, std::string &err);
void ipc_close(const IpcMapping &m);

// The device allocation that contains `ptr`.
bool allocation_range(const void *ptr, uint64_t &base, uint64_t &size, std::string &err);

// DMA-BUF export of device memory (for RDMA registration without
// nvidia-peermem). The fd covers the whole allocation; `offset` locates
// `ptr` inside it. The caller owns the fd.
struct DmabufExport {
    int fd = -1;
    int device = -1;
    uint64_t offset = 0;
    uint64_t base = 0;
    uint64_t size = 0;
};
void dmabuf_export(const void *ptr, size_t len, DmabufExport &out);
bool dmabuf_supported(int device);

// The PCI bus id of every GPU the CUDA driver shows this process, by
// ordinal, as cuDeviceGetPCIBusId writes it ("0000:3B:00.0"). false with
// `err` when libcuda.so.1 cannot be loaded or cuInit fails, and always in a
// CPU build (which never initializes CUDA).
bool driver_pci_bus_ids(std::vector<std::string> &out, std::string &err);

}  // namespace gpu
}  // namespace mcrs
