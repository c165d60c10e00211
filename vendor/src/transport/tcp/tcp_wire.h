// The TCP data-plane wire format (PROTOCOL.md section 4): a 24-byte
// little-endian request header, and in protocol v2 an 8-byte status frame
// whose high half is the magic "MCTV".
//
// Extension (ours only; sent only to targets whose descriptor carries
// "mc_cma"): the same-host session. After connecting, the initiator sends a
// HELLO header (opcode 0xC0, size 16) followed by its pid and the address
// of a 32-byte proof slot in its own memory (two LE u64). The target
// answers a status frame; OK is followed by a 32-byte random nonce. The
// initiator writes the nonce into its slot and sends a PROOF header (0xC1).
// The target reads the slot of that pid with process_vm_readv: only the
// process that received the nonce can hold it, so a match proves that the
// peer is that process on this host (same PID namespace, and the kernel
// lets us attach to it). The target answers OK (session verified) or
// REFUSED; either way the connection goes on, as plain TCP after REFUSED.
// On a verified session, CMA READ (0xC2) / CMA WRITE (0xC3) headers carry
// one more LE u64, the initiator's local address: the target checks the
// range against its registered remote-accessible buffers, pins it, copies
// with process_vm_writev (READ) / process_vm_readv (WRITE) from/into the
// initiator's memory and answers a status frame (OK, REJECTED and close as
// for TCP, or CMA_FAILED with the connection kept). No payload crosses
// the socket.
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
constexpr uint32_t kTcpStatusCmaRefused = 2;  // extension: same-host session refused
constexpr uint32_t kTcpStatusCmaFailed = 3;   // extension: the cross-process copy failed

constexpr uint8_t kTcpOpCmaHello = 0xC0;
constexpr uint8_t kTcpOpCmaProof = 0xC1;
constexpr uint8_t kTcpOpCmaRead = 0xC2;
constexpr uint8_t kTcpOpCmaWrite = 0xC3;
constexpr size_t kCmaHelloBodyLen = 16;   // pid, proof slot address
constexpr size_t kCmaNonceLen = 32;
constexpr size_t kCmaRequestLen = kTcpHeaderLen + 8;  // header + initiator address

// Only these four: other opcodes keep upstream's rule (not WRITE = READ).
inline bool tcp_is_cma(uint8_t opcode) { return opcode >= kTcpOpCmaHello && opcode <= kTcpOpCmaWrite; }

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
