#include "core/segment_cache.h"

#include "common/error.h"
#include "common/log.h"

namespace mcrs {

int32_t SegmentCache::open(const std::string &name, bool refresh, uint64_t max_age_ms) {
    int32_t stale_id = 0;  // a cached descriptor that is only old
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = ids_.find(name);
        if (it != ids_.end() && !refresh) {
            const Entry &e = entries_.at(it->second);
            const bool fresh = max_age_ms == 0 || std::chrono::steady_clock::now() - e.fetched_at <=
                                                      std::chrono::milliseconds(max_age_ms);
            if (e.desc && fresh) return e.id;
            if (e.desc) stale_id = e.id;
        }
    }
    // Fetch without holding the lock: it is network I/O.
    std::shared_ptr<const SegmentDesc> desc;
    try {
        desc = std::make_shared<const SegmentDesc>(fetch_(name));
    } catch (const Error &e) {
        if (stale_id == 0) throw;
        // The store is away: the descriptor we have is the best there is
        // (a segment already open keeps working).
        MC_LOG(Warn, "re-reading segment " << name << " failed; using the cached descriptor: " << e.what());
        return stale_id;
    }
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> g(mu_);
    auto it = ids_.find(name);
    if (it != ids_.end()) {
        Entry &e = entries_.at(it->second);
        e.desc = desc;
        e.fetched_at = now;
        return it->second;
    }
    if (next_id_ == INT32_MAX) throw Error(kErrTooManyRequests, "segment id space exhausted");
    int32_t id = next_id_++;
    ids_.emplace(name, id);
    entries_.emplace(id, Entry{id, name, desc, now});
    return id;
}

std::shared_ptr<const SegmentDesc> SegmentCache::get(int32_t id) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second.desc;
}

std::string SegmentCache::name_of(int32_t id) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = entries_.find(id);
    return it == entries_.end() ? std::string() : it->second.name;
}

bool SegmentCache::known(int32_t id) const {
    std::lock_guard<std::mutex> g(mu_);
    return entries_.count(id) != 0;
}

bool SegmentCache::evict(const std::string &name) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = ids_.find(name);
    if (it == ids_.end()) return false;
    entries_.at(it->second).desc.reset();
    return true;
}

std::pair<int, std::string> SegmentCache::refresh_all(const std::function<bool()> &stop) {
    std::vector<std::string> names;
    {
        std::lock_guard<std::mutex> g(mu_);
        for (const auto &kv : entries_)
            if (kv.second.desc) names.push_back(kv.second.name);
    }
    std::pair<int, std::string> first{0, ""};
    for (const auto &n : names) {
        if (stop && stop()) break;
        try {
            open(n, /*refresh=*/true);
        } catch (const Error &e) {
            MC_LOG(Warn, "re-fetching segment " << n << " failed: " << e.what());
            if (first.first == 0) first = {e.code(), e.what()};
        }
    }
    return first;
}

}  // namespace mcrs
