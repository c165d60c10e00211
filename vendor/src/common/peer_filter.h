// Who may connect to our listeners, and how to count connections per
// source address. A peer is identified by its IP address only (ports are
// free to pick), IPv4-mapped IPv6 addresses counting as the IPv4 address.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mcrs {

// The source address of an accepted connection as a map key: 4 bytes for
// IPv4 (mapped IPv6 included), 16 for IPv6; empty for anything else.
std::string source_key(const struct sockaddr_storage &ss);
// Printable form of a source_key ("127.0.0.2", "::1").
std::string source_text(const std::string &key);

// An allow-list of CIDR networks ("127.0.0.0/8", "fd00::/8", or a bare
// address = one host). Empty = everybody may connect.
class PeerFilter {
public:
    PeerFilter() = default;
    // Throws Error(kErrInvalidArgument) naming the first bad entry.
    static PeerFilter parse(const std::vector<std::string> &entries);
    bool empty() const { return nets_.empty(); }
    bool allows(const std::string &key) const;

private:
    struct Net {
        std::string prefix;  // 4 or 16 bytes
        unsigned bits = 0;
    };
    std::vector<Net> nets_;
};

// Logs at most one line a second for a recurring event, with the number of
// occurrences that were not logged.
class RateLimitedLog {
public:
    // True when the caller should log now; `suppressed` = events since the
    // last logged one.
    bool should_log(uint64_t &suppressed);

private:
    std::atomic<int64_t> last_ms_{-1000000};
    std::atomic<uint64_t> skipped_{0};
};

}  // namespace mcrs
