#include "transport/samehost/samehost_wire.h"

namespace mcrs {

namespace {

void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

}  // namespace

void encode_samehost_request(const SameHostRequest &r, unsigned char out[kSameHostRequestLen]) {
    for (size_t i = 0; i < 8; ++i) out[i] = 0;
    out[0] = r.opcode;
    put64(out + 8, r.target_addr);
    put64(out + 16, r.length);
    put64(out + 24, r.initiator_addr);
}

bool decode_samehost_request(const unsigned char *p, size_t n, SameHostRequest &out, std::string &why) {
    if (!p || n != kSameHostRequestLen) {
        why = "a request is " + std::to_string(kSameHostRequestLen) + " bytes, not " + std::to_string(n);
        return false;
    }
    SameHostRequest r;
    r.opcode = p[0];
    if (r.opcode != kSameHostOpRead && r.opcode != kSameHostOpWrite) {
        why = "unknown opcode " + std::to_string(r.opcode);
        return false;
    }
    for (size_t i = 1; i < 8; ++i)
        if (p[i] != 0) {
            why = "reserved bytes are not zero";
            return false;
        }
    r.target_addr = get64(p + 8);
    r.length = get64(p + 16);
    r.initiator_addr = get64(p + 24);
    if (r.length == 0 || r.length > kSameHostMaxLength) {
        why = "length " + std::to_string(r.length) + " is out of range";
        return false;
    }
    if (r.target_addr + r.length < r.target_addr || r.initiator_addr + r.length < r.initiator_addr) {
        why = "a range wraps around the address space";
        return false;
    }
    out = r;
    return true;
}

void encode_samehost_status(uint32_t code, unsigned char out[kSameHostStatusLen]) {
    put64(out, (static_cast<uint64_t>(kSameHostMagic) << 32) | code);
}

bool decode_samehost_status(const unsigned char *p, size_t n, uint32_t &code) {
    if (!p || n != kSameHostStatusLen) return false;
    uint64_t v = get64(p);
    if (static_cast<uint32_t>(v >> 32) != kSameHostMagic) return false;
    code = static_cast<uint32_t>(v);
    return true;
}

}  // namespace mcrs
