#include "core/segment_cache.h"

#include "common/error.h"
#include "common/log.h"

namespace mcrs {

int32_t SegmentCache::open(const std::string &name, bool refresh) {
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = ids_.find(name);
        if (it != ids_.end() && !refresh) {
            const Entry &e = entries_.at(it->second);
            if (e.desc) return e.id;
        }
    }
    // Fetch without holding the lock: it is network I/O.
    auto desc = std::make_shared<const SegmentDesc>(fetch_(name));
    std::lock_guard<std::mutex> g(mu_);
    auto it = ids_.find(name);
    if (it != ids_.end()) {
        entries_.at(it->second).desc = desc;
        return it->second;
    }
    if (next_id_ == INT32_MAX) throw Error(kErrTooManyRequests, "segment id space exhausted");
    int32_t id = next_id_++;
    ids_.emplace(name, id);
    entries_.emplace(id, Entry{id, name, desc});
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

std::pair<int, std::string> SegmentCache::refresh_all() {
    std::vector<std::string> names;
    {
        std::lock_guard<std::mutex> g(mu_);
        for (const auto &kv : entries_)
            if (kv.second.desc) names.push_back(kv.second.name);
    }
    std::pair<int, std::string> first{0, ""};
    for (const auto &n : names) {
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
