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
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/request.h"
#include "core/segment_descriptor.h"
#include "gpu/gpu.h"
#include "transport/transport.h"

namespace mcrs {

// Where the peer's bytes [addr, addr + len) lie inside the allocation that
// published buffer `b` belongs to, mapped here with `mapped_size` bytes, as
// an offset from the mapping's base. False unless the range is inside the
// buffer and the whole buffer (placed at the peer's mc_cuda_ipc_offset) is
// inside the allocation: the offset is the peer's word, the size is the
// driver's.
bool ipc_offset_in_mapping(const BufferDesc &b, uint64_t mapped_size, uint64_t addr, uint64_t len,
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
    // items[i] targets buffers[i]: a buffer of `desc` with an IPC handle
    // (kept alive here while any of them waits for its mapping).
    void submit(const std::shared_ptr<const SegmentDesc> &desc, std::vector<TransferItem> &items,
                const std::vector<const BufferDesc *> &buffers, Fallback fallback);
    // A block list (core/request.h) whose regions' remote spans lie in the
    // published buffers `buffers` (checked by the engine), as one task.
    struct BlockJob {
        const BlockList &list;
        const std::vector<const BufferDesc *> &buffers;
        const std::vector<uint64_t> &remote_lo, &remote_size;  // per region
        uint64_t remote_id_lo;                                 // lowest remote id
        std::vector<int> local_devices;                        // per region, -1 = host
        Batch &batch;
        size_t task;
        uint64_t bytes;
    };
    // Copies `job` on this thread when every allocation it names is mapped
    // already, and finishes its task (completed or failed): true. False, with
    // nothing done, when a mapping is missing or the transport stops.
    bool submit_blocks(const BlockJob &job);
    void stop();
    uint64_t copies() const { return copies_.load(std::memory_order_relaxed); }

private:
    struct Job {
        TransferItem item;
        const BufferDesc *buffer = nullptr;
        std::shared_ptr<const SegmentDesc> desc;  // owns *buffer
        Fallback fallback;
    };
    void work();
    // The mapping of b's allocation, opened on first use. False when it
    // cannot be mapped: `err` says why the first time and stays empty after.
    bool map(const BufferDesc &b, gpu::IpcMapping &out, std::string &err);
    // The items `idx` (their allocations mapped as `maps`), as one batched
    // copy.
    void copy_batch(std::vector<TransferItem> &items, const std::vector<const BufferDesc *> &buffers,
                    const std::vector<size_t> &idx, const std::vector<gpu::IpcMapping> &maps);

    std::mutex mu_;
    std::condition_variable work_cv_;     // workers: a job was queued, or stop
    std::condition_variable drained_cv_;  // stop(): the last inline copy ended
    std::deque<Job> jobs_;
    bool stopping_ = false;
    std::map<std::string, gpu::IpcMapping> mappings_;
    std::set<std::string> failed_;
    std::vector<std::thread> threads_;
    int inline_copies_ = 0;  // running on submitters' threads, guarded by mu_
    std::atomic<uint64_t> copies_{0};
};

}  // namespace mcrs
