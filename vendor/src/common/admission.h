// Who a listener admits: the peer allow-list, a cap on connections per
// source address and the refusal count and rate-limited log, shared by
// the handshake and TCP data listeners. Not thread-safe: the listener
// calls it under its own lock (or from its one thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/peer_filter.h"

namespace mcrs {

class SourceAdmission {
public:
    // `per_source` 0 = max(8, total / 8).
    SourceAdmission(const char *listener, PeerFilter allowed, uint32_t total, uint32_t per_source);

    // Why a connection from `src` must be refused (allow-list, then the
    // per-source cap), or nullptr.
    const char *refusal(const std::string &src) const;
    // Counts a refusal and logs it (at most a line a second).
    void refuse(const std::string &src, const char *why);
    void admitted(const std::string &src) { ++count_[src]; }
    void released(const std::string &src);
    void clear() { count_.clear(); }

    uint32_t per_source_cap() const { return per_source_cap_; }
    uint64_t refused() const { return refused_.load(); }

private:
    const char *listener_;
    PeerFilter allowed_;
    uint32_t total_;
    uint32_t per_source_cap_;
    std::unordered_map<std::string, uint32_t> count_;
    RateLimitedLog log_;
    std::atomic<uint64_t> refused_{0};
};

}  // namespace mcrs
