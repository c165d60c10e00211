// The same-host transport's wire format, spoken over an attested Unix
// stream socket (peer_identity.h). No payload crosses the socket: the
// target copies the bytes between the two processes itself (cma.h).
// Described in docs/wire-protocol.md, Same-host session.
//
//   greeting (target -> initiator, once, after the target accepted the
//   initiator's identity): one status frame, OK. A refused initiator gets
//   no greeting: the target closes the connection.
//
//   request (initiator -> target), 32 bytes, all little-endian:
//     u8  opcode        0 READ (target -> initiator), 1 WRITE (initiator -> target)
//     u8  reserved[7]   zero
//     u64 target_addr   inside one registered, remote-accessible host buffer
//     u64 length        1 .. kSameHostMaxLength
//     u64 initiator_addr
//
//   status (target -> initiator), 8 bytes: u64 LE = magic "MCSH" << 32 | code,
//   one per request, in request order. REJECTED closes the connection (the
//   initiator named memory it may not touch); COPY_FAILED keeps it (the copy
//   into or out of the initiator's own memory failed, e.g. EFAULT).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mcrs {

constexpr size_t kSameHostRequestLen = 32;
constexpr size_t kSameHostStatusLen = 8;
constexpr uint8_t kSameHostOpRead = 0;
constexpr uint8_t kSameHostOpWrite = 1;
constexpr uint32_t kSameHostMagic = 0x4D435348u;  // "MCSH"
constexpr uint32_t kSameHostOk = 0;
constexpr uint32_t kSameHostRejected = 1;
constexpr uint32_t kSameHostCopyFailed = 2;
// One request moves at most this much (1 TiB): far above any buffer, low
// enough that no address arithmetic on it can wrap with a bounded address.
constexpr uint64_t kSameHostMaxLength = uint64_t(1) << 40;

struct SameHostRequest {
    uint8_t opcode = 0;
    uint64_t target_addr = 0;
    uint64_t length = 0;
    uint64_t initiator_addr = 0;
};

void encode_samehost_request(const SameHostRequest &r, unsigned char out[kSameHostRequestLen]);
// Decodes exactly one request from `p` (n must be kSameHostRequestLen).
// Bounds every field: known opcode, zero reserved bytes, 1 <= length <=
// kSameHostMaxLength, neither range wraps around. False with `why` otherwise.
bool decode_samehost_request(const unsigned char *p, size_t n, SameHostRequest &out, std::string &why);

void encode_samehost_status(uint32_t code, unsigned char out[kSameHostStatusLen]);
// False when the frame lacks the magic; else `code` is set (any value: the
// caller decides what it knows).
bool decode_samehost_status(const unsigned char *p, size_t n, uint32_t &code);

}  // namespace mcrs
