// Framing of the handshake/RPC socket (docs/wire-protocol.md, Handshake
// port): an 8-byte little-endian length, then a type byte and JSON. A first
// body byte above 3 means the legacy framing with no type byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mcrs {

enum HandshakeType : uint8_t {
    kHsConnection = 0,
    kHsMetadata = 1,
    kHsNotify = 2,
    kHsProbe = 3,
    kHsOldProtocol = 0xFF,  // no type byte on the wire; handled as Connection
};

constexpr size_t kFrameHeaderLen = 8;

// The full frame: length prefix, type byte (omitted for kHsOldProtocol), JSON.
std::string encode_frame(uint8_t type, const std::string &json);
uint64_t decode_frame_length(const unsigned char header[kFrameHeaderLen]);

struct FrameBody {
    uint8_t type;
    std::string_view json;
};
FrameBody split_frame_body(std::string_view body);

const char *handshake_type_name(uint8_t type);

}  // namespace mcrs
