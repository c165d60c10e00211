// One request/reply exchange on a peer's handshake port, bounded by a
// connect timeout and an overall deadline.
#pragma once

#include <cstdint>
#include <string>

#include "common/json.h"

namespace mcrs {

struct HandshakeClientOptions {
    uint32_t connect_timeout_ms = 5000;
    uint32_t timeout_ms = 10000;
    uint64_t max_length = 1u << 20;
};

// Throws Error: kErrDns, kErrSocket (connect, I/O, timeout, type mismatch,
// bad length), kErrMalformedJson.
Json handshake_request(const std::string &host, uint16_t port, uint8_t type, const Json &body,
                       const HandshakeClientOptions &opt);

}  // namespace mcrs
