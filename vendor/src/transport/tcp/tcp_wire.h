// The TCP data-plane wire format (docs/wire-protocol.md, TCP data port): a
// 24-byte little-endian request header, and in protocol v2 an 8-byte status
// frame whose high half is the magic "MCTV".
#pragma once

#include <cstdint>
#include <cstring>

namespace mcrs {

constexpr size_t kTcpHeaderLen = 24;
constexpr uint8_t kTcpOpRead = 0;
constexpr uint8_t kTcpOpWrite = 1;
constexpr uint8_t kTcpV2Flag = 0x80;
constexpr uint32_t kTcpStatusMagic = 0x4D435456u;
constexpr uint32_t kTcpStatusOk = 0;
constexpr uint32_t kTcpStatusRejected = 1;

struct TcpHeader {
    uint64_t size = 0;
    uint64_t addr = 0;
    uint8_t opcode = 0;  // raw byte, flag included
};

inline void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint64_t get_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

inline void encode_tcp_header(const TcpHeader &h, unsigned char out[kTcpHeaderLen]) {
    std::memset(out, 0, kTcpHeaderLen);
    put_le64(out, h.size);
    put_le64(out + 8, h.addr);
    out[16] = h.opcode;
}

inline TcpHeader decode_tcp_header(const unsigned char in[kTcpHeaderLen]) {
    TcpHeader h;
    h.size = get_le64(in);
    h.addr = get_le64(in + 8);
    h.opcode = in[16];
    return h;
}

inline bool tcp_is_v2(uint8_t opcode) { return (opcode & kTcpV2Flag) != 0; }
// Upstream servers treat everything that is not WRITE as READ.
inline bool tcp_is_write(uint8_t opcode) { return (opcode & 0x7F) == kTcpOpWrite; }

inline uint64_t encode_tcp_status(uint32_t status) {
    return (static_cast<uint64_t>(kTcpStatusMagic) << 32) | status;
}

// An initiator's reading of a v2 status frame from a (possibly hostile)
// target: `valid` is false without the magic; `code` is the low half.
struct TcpStatus {
    bool valid = false;
    uint32_t code = 0;
};
inline TcpStatus decode_tcp_status(const unsigned char in[8]) {
    uint64_t v = get_le64(in);
    TcpStatus s;
    s.valid = static_cast<uint32_t>(v >> 32) == kTcpStatusMagic;
    s.code = static_cast<uint32_t>(v);
    return s;
}

}  // namespace mcrs
