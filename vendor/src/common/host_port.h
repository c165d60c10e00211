// Segment names in P2PHANDSHAKE mode are "<host>:<handshake port>"; this
// parses and builds them with upstream's rules (IPv6 in brackets, the port
// after the last ':', a default port when none parses; docs/wire-protocol.md,
// Segment names).
#pragma once

#include <cstdint>
#include <string>

namespace mcrs {

constexpr uint16_t kDefaultHandshakePort = 12001;

struct HostPort {
    std::string host;
    uint16_t port = 0;
};

bool is_ipv6_literal(const std::string &s);
// `default_port` is used when the name has no port or one that does not
// parse as a uint16.
HostPort parse_host_port(const std::string &name, uint16_t default_port = kDefaultHandshakePort);
// "[v6]" for IPv6 literals, the host unchanged otherwise.
std::string wrap_ipv6(const std::string &host);
std::string join_host_port(const std::string &host, uint16_t port);

}  // namespace mcrs
