// The same-host GPU path: when a peer engine runs on this host (another
// process) and advertises a CUDA IPC handle for the target buffer, the
// bytes move with the copy engines through the mapped allocation, without
// the network. Anything that cannot be mapped falls back to TCP.
// Copies into allocations that are already mapped run on the submitting
// thread, like local copies: at GPU speeds a 64 MiB copy takes ~40 us, about
// what handing it to a worker and back costs. Workers open new mappings
// (cudaIpcOpenMemHandle takes milliseconds) and copy what was queued for
// them in one batch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu.h"
#include "transport/transport.h"

namespace mcrs {

struct IpcTarget {
    std::string handle;      // the peer allocation's IPC handle (hex)
    uint64_t buffer_addr;    // the advertised buffer, in the peer's addresses
    uint64_t buffer_len;
    uint64_t ipc_offset;     // of the buffer inside the allocation
    int device;              // the peer's GPU ordinal
};

// Where the peer's bytes [addr, addr + len) lie inside its mapped
// allocation of `mapped_size` bytes, as an offset from the mapping's base.
// False unless the range is inside the advertised buffer and the whole
// buffer (placed at the peer's `ipc_offset`) is inside the allocation: the
// offset is the peer's word, the size is the driver's.
bool ipc_offset_in_mapping(const IpcTarget &t, uint64_t mapped_size, uint64_t addr, uint64_t len,
                           uint64_t &offset);

class IpcTransport {
public:
    // Takes items that could not use IPC after all (the mapping failed).
    using Fallback = std::function<void(std::vector<TransferItem> &)>;

    explicit IpcTransport(int workers);
    ~IpcTransport();
    IpcTransport(const IpcTransport &) = delete;
    IpcTransport &operator=(const IpcTransport &) = delete;

    // False once mapping `handle` has failed: route to TCP directly.
    bool usable(const std::string &handle);
    void submit(std::vector<TransferItem> &items, std::vector<IpcTarget> &targets, Fallback fallback);
    void stop();
    uint64_t copies() const { return copies_.load(std::memory_order_relaxed); }

private:
    struct Job {
        TransferItem item;
        IpcTarget target;
        Fallback fallback;
    };
    void work();
    bool map(const IpcTarget &t, gpu::IpcMapping &out, std::string &err);
    // The items `idx` (their allocations mapped as `maps`), as one batched
    // copy.
    void copy_batch(std::vector<TransferItem> &items, const std::vector<IpcTarget> &targets,
                    const std::vector<size_t> &idx, const std::vector<gpu::IpcMapping> &maps);

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    bool stopping_ = false;
    std::map<std::string, gpu::IpcMapping> mappings_;
    std::set<std::string> failed_;
    std::vector<std::thread> threads_;
    int inline_copies_ = 0;  // running on submitters' threads, guarded by mu_
    std::atomic<uint64_t> copies_{0};
};

}  // namespace mcrs
