#include "handshake/frame.h"

namespace mcrs {

std::string encode_frame(uint8_t type, const std::string &json) {
    bool typed = type != kHsOldProtocol;
    uint64_t len = json.size() + (typed ? 1 : 0);
    std::string out;
    out.reserve(kFrameHeaderLen + len);
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xFF));
    if (typed) out.push_back(static_cast<char>(type));
    out += json;
    return out;
}

uint64_t decode_frame_length(const unsigned char h[kFrameHeaderLen]) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | h[i];
    return v;
}

FrameBody split_frame_body(std::string_view body) {
    if (!body.empty() && static_cast<unsigned char>(body[0]) <= kHsProbe)
        return FrameBody{static_cast<uint8_t>(body[0]), body.substr(1)};
    return FrameBody{kHsOldProtocol, body};
}

const char *handshake_type_name(uint8_t type) {
    switch (type) {
        case kHsConnection: return "connection";
        case kHsMetadata: return "metadata";
        case kHsNotify: return "notify";
        case kHsProbe: return "probe";
        case kHsOldProtocol: return "connection (legacy framing)";
        default: return "unknown";
    }
}

}  // namespace mcrs
