#include "common/host_port.h"

#include <arpa/inet.h>
#include <cstdlib>

namespace mcrs {

bool is_ipv6_literal(const std::string &s) {
    std::string h = s;
    auto pct = h.find('%');
    if (pct != std::string::npos) h = h.substr(0, pct);
    in6_addr a;
    return inet_pton(AF_INET6, h.c_str(), &a) == 1;
}

namespace {
bool parse_port(const std::string &s, uint16_t &out) {
    if (s.empty() || s.size() > 5) return false;
    unsigned v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<unsigned>(c - '0');
    }
    if (v > 65535) return false;
    out = static_cast<uint16_t>(v);
    return true;
}
}  // namespace

HostPort parse_host_port(const std::string &name, uint16_t default_port) {
    HostPort hp;
    hp.port = default_port;
    if (!name.empty() && name[0] == '[') {
        auto close = name.find(']');
        if (close != std::string::npos) {
            hp.host = name.substr(1, close - 1);
            if (close + 1 < name.size() && name[close + 1] == ':') {
                uint16_t p;
                if (parse_port(name.substr(close + 2), p)) hp.port = p;
            }
            return hp;
        }
    }
    if (is_ipv6_literal(name)) {
        hp.host = name;
        return hp;
    }
    auto colon = name.rfind(':');
    if (colon == std::string::npos) {
        hp.host = name;
        return hp;
    }
    std::string host = name.substr(0, colon);
    // "v6addr%scope:port" (unbracketed IPv6 with a port after a scope id).
    hp.host = host;
    uint16_t p;
    if (parse_port(name.substr(colon + 1), p)) hp.port = p;
    return hp;
}

std::string wrap_ipv6(const std::string &host) {
    if (!host.empty() && host[0] != '[' && is_ipv6_literal(host)) return "[" + host + "]";
    return host;
}

std::string join_host_port(const std::string &host, uint16_t port) {
    return wrap_ipv6(host) + ":" + std::to_string(port);
}

}  // namespace mcrs
