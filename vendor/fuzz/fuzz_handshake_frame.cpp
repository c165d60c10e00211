// The handshake port's framing, as both the server and the client read it:
// an 8-byte little-endian length, a type byte (or legacy framing without
// one), then JSON. Input = the bytes a peer sends. The frame that is read
// must re-encode to exactly the same bytes, and its JSON is parsed as the
// server does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/json.h"
#include "fuzz_check.h"
#include "handshake/frame.h"

using namespace mcrs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < kFrameHeaderLen) return 0;
    uint64_t len = decode_frame_length(data);
    // The server's bound (HandshakeServerOptions::max_length default).
    if (len == 0 || len > (1u << 20) || len > size - kFrameHeaderLen) return 0;
    std::string_view body(reinterpret_cast<const char *>(data + kFrameHeaderLen),
                          static_cast<size_t>(len));
    FrameBody fb = split_frame_body(body);
    FUZZ_CHECK(handshake_type_name(fb.type) != nullptr, "no type name");
    FUZZ_CHECK(fb.json.size() + (fb.type == kHsOldProtocol ? 0 : 1) == body.size(),
               "type byte accounting");
    std::string again = encode_frame(fb.type, std::string(fb.json));
    FUZZ_CHECK(again == std::string(reinterpret_cast<const char *>(data),
                                     kFrameHeaderLen + static_cast<size_t>(len)),
               "frame does not re-encode to the same bytes");
    try {
        Json j = Json::parse(fb.json);
        // What the server would answer with, framed the same way.
        std::string reply = encode_frame(fb.type, j.dump() + "\n");
        FUZZ_CHECK(decode_frame_length(reinterpret_cast<const unsigned char *>(reply.data())) ==
                       reply.size() - kFrameHeaderLen,
                   "reply length");
    } catch (const Error &) {
    }
    return 0;
}
