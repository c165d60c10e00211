#include "transport/ipc/ipc_transport.h"

#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "common/range.h"
#include "gpu/gpu.h"

namespace mcrs {

IpcTransport::IpcTransport(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

IpcTransport::~IpcTransport() { stop(); }

void IpcTransport::stop() {
    std::deque<Job> left;
    {
        std::unique_lock<std::mutex> lk(mu_);
        if (stopping_ && threads_.empty()) return;
        stopping_ = true;
        left.swap(jobs_);
        // Mappings are closed below: let copies on submitters' threads end.
        drained_cv_.wait(lk, [this] { return inline_copies_ == 0; });
    }
    work_cv_.notify_all();
    for (auto &j : left) j.item.fail("the engine is shutting down");
    for (auto &t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
    for (auto &kv : mappings_) gpu::ipc_close(kv.second);
    mappings_.clear();
}

bool IpcTransport::usable(const std::string &handle) {
    std::lock_guard<std::mutex> g(mu_);
    return failed_.count(handle) == 0;
}

void IpcTransport::submit(const std::shared_ptr<const SegmentDesc> &desc, std::vector<TransferItem> &items,
                          const std::vector<const BufferDesc *> &buffers, Fallback fallback) {
    std::vector<TransferItem> rejected;
    std::vector<size_t> now;  // already mapped: copy on this thread
    std::vector<gpu::IpcMapping> maps;
    bool queued = false;
    now.reserve(items.size());
    maps.reserve(items.size());
    {
        std::lock_guard<std::mutex> g(mu_);
        // Requests come in runs against one buffer: look its mapping up once
        // per run, not once per request.
        const BufferDesc *last = nullptr;
        const gpu::IpcMapping *last_map = nullptr;
        for (size_t i = 0; i < items.size(); ++i) {
            if (stopping_) {
                rejected.push_back(std::move(items[i]));
                continue;
            }
            if (buffers[i] != last) {
                last = buffers[i];
                auto m = mappings_.find(last->cuda_ipc);
                last_map = m == mappings_.end() ? nullptr : &m->second;
            }
            if (last_map) {
                now.push_back(i);
                maps.push_back(*last_map);
            } else {
                jobs_.push_back(Job{std::move(items[i]), buffers[i], desc, fallback});
                queued = true;
            }
        }
        if (!now.empty()) ++inline_copies_;
    }
    // Wake the workers only when there is work: waking both on every
    // submission was a fixed cost that every copy paid.
    if (queued) work_cv_.notify_all();
    for (auto &it : rejected) it.fail("the engine is shutting down");
    if (now.empty()) return;
    // stop() waits for inline copies: count this one down however it ends.
    struct Done {
        IpcTransport *t;
        ~Done() {
            std::lock_guard<std::mutex> g(t->mu_);
            if (--t->inline_copies_ == 0 && t->stopping_) t->drained_cv_.notify_all();
        }
    } done{this};
    copy_batch(items, buffers, now, maps);
}

bool IpcTransport::submit_blocks(const BlockJob &job) {
    const BlockList &l = job.list;
    std::vector<gpu::IpcMapping> maps(l.num_regions);
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_) return false;
        const BufferDesc *last = nullptr;
        const gpu::IpcMapping *last_map = nullptr;
        for (size_t r = 0; r < l.num_regions; ++r) {
            if (job.buffers[r] != last) {
                last = job.buffers[r];
                auto m = mappings_.find(last->cuda_ipc);
                if (m == mappings_.end()) return false;  // the per-request path maps it
                last_map = &m->second;
            }
            maps[r] = *last_map;
        }
        ++inline_copies_;
    }
    struct Done {  // stop() waits for inline copies
        IpcTransport *t;
        ~Done() {
            std::lock_guard<std::mutex> g(t->mu_);
            if (--t->inline_copies_ == 0 && t->stopping_) t->drained_cv_.notify_all();
        }
    } done{this};
    const bool write = l.opcode == kOpWrite;
    std::vector<gpu::BlockCopyRegion> regions(l.num_regions);
    for (size_t r = 0; r < l.num_regions; ++r) {
        const BlockRegion &g = l.regions[r];
        const BufferDesc &b = *job.buffers[r];
        uint64_t offset = 0;
        if (!ipc_offset_in_mapping(b, maps[r].size, job.remote_lo[r], job.remote_size[r], offset)) {
            job.batch.fail(job.task, "the peer's CUDA IPC descriptor places its buffer (mc_cuda_ipc_offset " +
                                         std::to_string(b.cuda_ipc_offset) + ", " + std::to_string(b.length) +
                                         " bytes) outside the allocation it maps (" + std::to_string(maps[r].size) +
                                         " bytes)");
            return true;
        }
        // Block 0 of the region in this process's mapping: the span starts
        // at the lowest remote id (64-bit wrapping, as the kernel computes).
        const uint64_t span = reinterpret_cast<uint64_t>(maps[r].base) + offset;
        const uint64_t remote0 = span - job.remote_id_lo * g.remote_stride;
        const int local = job.local_devices[r];
        if (write)
            regions[r] = gpu::BlockCopyRegion{remote0, g.local_base, g.remote_stride, g.local_stride, g.block_len,
                                              maps[r].device, local};
        else
            regions[r] = gpu::BlockCopyRegion{g.local_base, remote0, g.local_stride, g.remote_stride, g.block_len,
                                              local, maps[r].device};
    }
    try {
        gpu::copy_blocks(regions.data(), regions.size(), write ? l.remote_ids : l.local_ids,
                         write ? l.local_ids : l.remote_ids, l.num_blocks);
    } catch (const std::exception &e) {  // a CUDA error, or memory for the copy's tables
        job.batch.fail(job.task, std::string("same-host GPU block-list copy failed: ") + e.what());
        return true;
    }
    copies_.fetch_add(l.num_regions * l.num_blocks, std::memory_order_relaxed);
    job.batch.complete(job.task, job.bytes);
    return true;
}

bool IpcTransport::map(const BufferDesc &b, gpu::IpcMapping &out, std::string &err) {
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = mappings_.find(b.cuda_ipc);
        if (it != mappings_.end()) {
            out = it->second;
            return true;
        }
        if (failed_.count(b.cuda_ipc)) return false;  // said once, when it failed
    }
    gpu::IpcMapping fresh;
    bool ok = gpu::ipc_open(b.cuda_ipc, b.cuda_device, fresh, err);
    std::lock_guard<std::mutex> g(mu_);
    if (!ok) {
        failed_.insert(b.cuda_ipc);
        return false;
    }
    auto ins = mappings_.emplace(b.cuda_ipc, fresh);
    if (!ins.second) {  // another worker mapped it meanwhile
        gpu::ipc_close(fresh);
        out = ins.first->second;
        return true;
    }
    MC_LOG(Info, "mapped a peer GPU allocation of " << fresh.size << " bytes (peer's GPU " << b.cuda_device
                                                    << ", mapped on GPU " << fresh.device << ") for the same-host path");
    out = fresh;
    return true;
}

void IpcTransport::work() {
    for (;;) {
        Job job;
        {
            std::unique_lock<std::mutex> lk(mu_);
            work_cv_.wait(lk, [this] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return;
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        std::string err;
        gpu::IpcMapping mapped;
        if (!map(*job.buffer, mapped, err)) {
            if (!err.empty())  // once per allocation, not per request
                MC_LOG(Warn, "same-host GPU path unavailable (" << err << "); using TCP");
            std::vector<TransferItem> one;
            one.push_back(std::move(job.item));
            job.fallback(one);
            continue;
        }
        // The first submission into a fresh mapping queued all its items
        // here: copy every queued item whose allocation is now mapped as
        // one batch (one pass over the queue), not one copy and wait each.
        std::vector<TransferItem> items;
        std::vector<const BufferDesc *> buffers;
        std::vector<std::shared_ptr<const SegmentDesc>> descs;  // own the buffers until copied
        std::vector<gpu::IpcMapping> maps;
        items.push_back(std::move(job.item));
        buffers.push_back(job.buffer);
        descs.push_back(std::move(job.desc));
        maps.push_back(mapped);
        {
            std::lock_guard<std::mutex> g(mu_);
            std::deque<Job> unmapped;
            for (auto &j : jobs_) {
                auto m = mappings_.find(j.buffer->cuda_ipc);
                if (m == mappings_.end()) {
                    unmapped.push_back(std::move(j));
                    continue;
                }
                items.push_back(std::move(j.item));
                buffers.push_back(j.buffer);
                if (descs.back() != j.desc) descs.push_back(std::move(j.desc));
                maps.push_back(m->second);
            }
            jobs_.swap(unmapped);
        }
        std::vector<size_t> idx(items.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        copy_batch(items, buffers, idx, maps);
    }
}

bool ipc_offset_in_mapping(const BufferDesc &b, uint64_t mapped_size, uint64_t addr, uint64_t len,
                           uint64_t &offset) {
    // Both with the one range check: the buffer inside the allocation, then
    // the range inside the buffer; the sum below then cannot wrap.
    if (!range_within(b.cuda_ipc_offset, b.length, 0, mapped_size)) return false;
    if (!range_within(addr, len, b.addr, b.length)) return false;
    offset = b.cuda_ipc_offset + (addr - b.addr);
    return true;
}

void IpcTransport::copy_batch(std::vector<TransferItem> &items, const std::vector<const BufferDesc *> &buffers,
                              const std::vector<size_t> &idx, const std::vector<gpu::IpcMapping> &maps) {
    // One stream, one wait for the whole submission: a wait per item cost
    // more than a KV block's copy.
    thread_local std::vector<gpu::CopyPiece> pieces;
    thread_local std::vector<size_t> copied;
    pieces.clear();
    copied.clear();
    size_t refused = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
        TransferItem &it = items[idx[k]];
        const BufferDesc &b = *buffers[idx[k]];
        const gpu::IpcMapping &m = maps[k];
        uint64_t offset = 0;
        if (!ipc_offset_in_mapping(b, m.size, it.remote_addr, it.length, offset)) {
            ++refused;
            it.fail("the peer's CUDA IPC descriptor places its buffer (mc_cuda_ipc_offset " +
                    std::to_string(b.cuda_ipc_offset) + ", " + std::to_string(b.length) +
                    " bytes) outside the allocation it maps (" + std::to_string(m.size) + " bytes)");
            continue;
        }
        char *remote = static_cast<char *>(m.base) + offset;
        const int local = it.local_device();
        if (it.opcode == 1) pieces.push_back(gpu::CopyPiece{remote, m.device, it.local, local, it.length});
        else pieces.push_back(gpu::CopyPiece{it.local, local, remote, m.device, it.length});
        copied.push_back(idx[k]);
    }
    if (refused)  // once per submission, not per descriptor
        MC_LOG(Warn, "same-host GPU path: refused " << refused
                         << " request(s) whose peer descriptor places its buffer outside the mapped allocation");
    if (copied.empty()) return;
    std::string err;
    try {
        gpu::copy_many(pieces.data(), pieces.size());
    } catch (const Error &e) {
        err = e.what();
    }
    if (err.empty()) copies_.fetch_add(copied.size(), std::memory_order_relaxed);
    for (size_t k : copied) {
        if (err.empty()) items[k].complete();
        else items[k].fail("same-host GPU copy failed: " + err);
    }
}

}  // namespace mcrs
