#include "transport/ipc/ipc_transport.h"

#include <sstream>

#include "common/error.h"
#include "common/log.h"
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
        cv_.wait(lk, [this] { return inline_copies_ == 0; });
    }
    cv_.notify_all();
    for (auto &j : left) j.item.fail("the engine is shutting down");
    for (auto &t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
    for (auto &kv : mappings_) gpu::ipc_close(kv.second.base, kv.second.device);
    mappings_.clear();
}

bool IpcTransport::usable(const std::string &handle) {
    std::lock_guard<std::mutex> g(mu_);
    return failed_.count(handle) == 0;
}

void IpcTransport::submit(std::vector<TransferItem> &items, std::vector<IpcTarget> &targets, Fallback fallback) {
    std::vector<TransferItem> rejected;
    std::vector<size_t> now;  // already mapped: copy on this thread
    std::vector<std::pair<char *, int>> bases;
    {
        std::lock_guard<std::mutex> g(mu_);
        for (size_t i = 0; i < items.size(); ++i) {
            auto m = mappings_.find(targets[i].handle);
            if (stopping_) {
                rejected.push_back(std::move(items[i]));
            } else if (m != mappings_.end()) {
                now.push_back(i);
                bases.emplace_back(static_cast<char *>(m->second.base), m->second.device);
            } else {
                jobs_.push_back(Job{std::move(items[i]), targets[i], fallback});
            }
        }
        if (!now.empty()) ++inline_copies_;
    }
    cv_.notify_all();
    for (auto &it : rejected) it.fail("the engine is shutting down");
    if (now.empty()) return;
    copy_batch(items, targets, now, bases);
    std::lock_guard<std::mutex> g(mu_);
    if (--inline_copies_ == 0) cv_.notify_all();
}

void *IpcTransport::map(const IpcTarget &t, int &mapped_device, std::string &err) {
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = mappings_.find(t.handle);
        if (it != mappings_.end()) {
            mapped_device = it->second.device;
            return it->second.base;
        }
        if (failed_.count(t.handle)) {
            err = "mapping this allocation failed before";
            return nullptr;
        }
    }
    void *base = gpu::ipc_open(t.handle, t.device, mapped_device, err);
    std::lock_guard<std::mutex> g(mu_);
    if (!base) {
        failed_.insert(t.handle);
        return nullptr;
    }
    auto ins = mappings_.emplace(t.handle, Mapping{base, mapped_device});
    if (!ins.second) {  // another worker mapped it meanwhile
        gpu::ipc_close(base, mapped_device);
        mapped_device = ins.first->second.device;
        return ins.first->second.base;
    }
    MC_LOG(Info, "mapped a peer GPU allocation (peer's GPU " << t.device << ", mapped on GPU " << mapped_device
                                                            << ") for the same-host path");
    return base;
}

void IpcTransport::work() {
    for (;;) {
        Job job;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [this] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return;
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        std::string err;
        int mapped_device = -1;
        char *base = static_cast<char *>(map(job.target, mapped_device, err));
        if (!base) {
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
        std::vector<IpcTarget> targets;
        std::vector<std::pair<char *, int>> bases;
        items.push_back(std::move(job.item));
        targets.push_back(std::move(job.target));
        bases.emplace_back(base, mapped_device);
        {
            std::lock_guard<std::mutex> g(mu_);
            std::deque<Job> unmapped;
            for (auto &j : jobs_) {
                auto m = mappings_.find(j.target.handle);
                if (m == mappings_.end()) {
                    unmapped.push_back(std::move(j));
                    continue;
                }
                items.push_back(std::move(j.item));
                targets.push_back(std::move(j.target));
                bases.emplace_back(static_cast<char *>(m->second.base), m->second.device);
            }
            jobs_.swap(unmapped);
        }
        std::vector<size_t> idx(items.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        copy_batch(items, targets, idx, bases);
    }
}

void IpcTransport::copy_batch(std::vector<TransferItem> &items, const std::vector<IpcTarget> &targets,
                              const std::vector<size_t> &idx, const std::vector<std::pair<char *, int>> &bases) {
    // One stream, one wait for the whole submission: a wait per item cost
    // more than a KV block's copy.
    thread_local std::vector<gpu::CopyPiece> pieces;
    pieces.clear();
    for (size_t k = 0; k < idx.size(); ++k) {
        TransferItem &it = items[idx[k]];
        const IpcTarget &t = targets[idx[k]];
        // The engine checked that the range lies inside the advertised buffer.
        char *remote = bases[k].first + t.ipc_offset + (it.remote_addr - t.buffer_addr);
        const int mapped = bases[k].second, local = it.local_device();
        if (it.opcode == 1) pieces.push_back(gpu::CopyPiece{remote, mapped, it.local, local, it.length});
        else pieces.push_back(gpu::CopyPiece{it.local, local, remote, mapped, it.length});
    }
    std::string err;
    try {
        gpu::copy_many(pieces.data(), pieces.size());
    } catch (const Error &e) {
        err = e.what();
    }
    if (err.empty()) copies_.fetch_add(idx.size(), std::memory_order_relaxed);
    for (size_t k : idx) {
        if (err.empty()) items[k].complete();
        else items[k].fail("same-host GPU copy failed: " + err);
    }
}

}  // namespace mcrs
