#include "common/peer_filter.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/text.h"

namespace mcrs {

std::string source_key(const struct sockaddr_storage &ss) {
    if (ss.ss_family == AF_INET) {
        const auto *a = reinterpret_cast<const sockaddr_in *>(&ss);
        return std::string(reinterpret_cast<const char *>(&a->sin_addr), 4);
    }
    if (ss.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(&ss);
        const char *b = reinterpret_cast<const char *>(&a->sin6_addr);
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) return std::string(b + 12, 4);
        return std::string(b, 16);
    }
    return std::string();
}

std::string source_text(const std::string &key) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (key.size() == 4) ::inet_ntop(AF_INET, key.data(), buf, sizeof buf);
    else if (key.size() == 16) ::inet_ntop(AF_INET6, key.data(), buf, sizeof buf);
    return buf;
}

PeerFilter PeerFilter::parse(const std::vector<std::string> &entries) {
    PeerFilter f;
    for (const std::string &raw : entries) {
        std::string e = trim(raw);
        auto bad = [&](const std::string &why) {
            throw Error(kErrInvalidArgument,
                        "allowed peer network '" + raw + "' is invalid: " + why);
        };
        std::string addr = e, len;
        size_t slash = e.find('/');
        if (slash != std::string::npos) {
            addr = e.substr(0, slash);
            len = e.substr(slash + 1);
        }
        Net n;
        unsigned char buf[16];
        if (::inet_pton(AF_INET, addr.c_str(), buf) == 1) {
            n.prefix.assign(reinterpret_cast<char *>(buf), 4);
        } else if (::inet_pton(AF_INET6, addr.c_str(), buf) == 1) {
            n.prefix.assign(reinterpret_cast<char *>(buf), 16);
            // A mapped IPv4 network is the IPv4 network.
            if (IN6_IS_ADDR_V4MAPPED(reinterpret_cast<in6_addr *>(buf))) {
                n.prefix = n.prefix.substr(12);
                if (!len.empty() && len.find_first_not_of("0123456789") == std::string::npos &&
                    len.size() <= 3 && std::stoul(len) >= 96)
                    len = std::to_string(std::stoul(len) - 96);
                else if (!len.empty())
                    bad("a mapped IPv4 network needs a prefix length of 96..128");
            }
        } else {
            bad("not an IPv4 or IPv6 address");
        }
        const unsigned max = static_cast<unsigned>(n.prefix.size() * 8);
        if (len.empty()) {
            if (slash != std::string::npos) bad("empty prefix length");
            n.bits = max;
        } else {
            if (len.find_first_not_of("0123456789") != std::string::npos || len.size() > 3)
                bad("prefix length is not a number");
            n.bits = static_cast<unsigned>(std::stoul(len));
            if (n.bits > max) bad("prefix length above " + std::to_string(max));
        }
        f.nets_.push_back(n);
    }
    return f;
}

bool PeerFilter::allows(const std::string &key) const {
    if (nets_.empty()) return true;
    for (const Net &n : nets_) {
        if (n.prefix.size() != key.size()) continue;
        unsigned full = n.bits / 8, rest = n.bits % 8;
        if (std::memcmp(n.prefix.data(), key.data(), full) != 0) continue;
        if (rest) {
            unsigned char mask = static_cast<unsigned char>(0xFF00u >> rest);
            if ((static_cast<unsigned char>(n.prefix[full]) & mask) !=
                (static_cast<unsigned char>(key[full]) & mask))
                continue;
        }
        return true;
    }
    return false;
}

bool RateLimitedLog::should_log(uint64_t &suppressed) {
    int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
    int64_t last = last_ms_.load(std::memory_order_relaxed);
    if (now - last < 1000 || !last_ms_.compare_exchange_strong(last, now)) {
        skipped_.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    suppressed = skipped_.exchange(0);
    return true;
}

}  // namespace mcrs
