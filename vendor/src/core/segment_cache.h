// Remote segments known to an engine: name <-> id, and the last descriptor
// fetched for each. Ids start at 1 (0 is LOCAL_SEGMENT) and are never reused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/segment_descriptor.h"

namespace mcrs {

class SegmentCache {
public:
    // Fetches a descriptor from its owner; throws Error on failure.
    using Fetcher = std::function<SegmentDesc(const std::string &name)>;

    explicit SegmentCache(Fetcher fetch) : fetch_(std::move(fetch)) {}

    // Returns the id for `name`, fetching the descriptor when it is not
    // cached, when `refresh` is set, or when the cached one is older than
    // `max_age_ms` (0 = no limit; when that re-read fails, the cached one
    // is used). Throws Error.
    int32_t open(const std::string &name, bool refresh, uint64_t max_age_ms = 0);
    // The descriptor for an id; nullptr when unknown or evicted.
    std::shared_ptr<const SegmentDesc> get(int32_t id) const;
    std::string name_of(int32_t id) const;
    bool known(int32_t id) const;
    // Drops the cached descriptor (the id stays reserved for the name).
    bool evict(const std::string &name);
    // Refetches every cached descriptor; returns the first error, if any
    // (code, message), after trying them all; stops early once `stop`
    // says so.
    std::pair<int, std::string> refresh_all(const std::function<bool()> &stop = {});

private:
    struct Entry {
        int32_t id;
        std::string name;
        std::shared_ptr<const SegmentDesc> desc;
        std::chrono::steady_clock::time_point fetched_at;
    };
    Fetcher fetch_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, int32_t> ids_;
    std::unordered_map<int32_t, Entry> entries_;
    int32_t next_id_ = 1;
};

}  // namespace mcrs
