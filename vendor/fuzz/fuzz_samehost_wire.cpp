// The same-host transport's wire decoders (samehost_wire.h): a target
// decodes an initiator's 32-byte requests, an initiator decodes a target's
// 8-byte statuses. Input = back-to-back frames as a hostile peer sends them.
// Whatever decodes must satisfy every bound the decoder promises and
// re-encode to the same bytes; nothing else may be accepted.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "transport/samehost/samehost_wire.h"

using namespace mcrs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // A wrong length is refused, never read past.
    SameHostRequest r;
    std::string why;
    FUZZ_CHECK(!decode_samehost_request(data, size < kSameHostRequestLen ? size : kSameHostRequestLen - 1, r, why),
               "a short request decoded");
    for (size_t off = 0; off + kSameHostRequestLen <= size; off += kSameHostRequestLen) {
        SameHostRequest q;
        why.clear();
        if (!decode_samehost_request(data + off, kSameHostRequestLen, q, why)) {
            FUZZ_CHECK(!why.empty(), "refused without a reason");
            continue;
        }
        FUZZ_CHECK(q.opcode == kSameHostOpRead || q.opcode == kSameHostOpWrite, "unknown opcode accepted");
        FUZZ_CHECK(q.length >= 1 && q.length <= kSameHostMaxLength, "length out of bounds");
        FUZZ_CHECK(q.target_addr + q.length > q.target_addr, "target range wraps");
        FUZZ_CHECK(q.initiator_addr + q.length > q.initiator_addr, "initiator range wraps");
        unsigned char again[kSameHostRequestLen];
        encode_samehost_request(q, again);
        FUZZ_CHECK(std::memcmp(again, data + off, kSameHostRequestLen) == 0, "request does not re-encode");
    }
    for (size_t off = 0; off + kSameHostStatusLen <= size; off += kSameHostStatusLen) {
        uint32_t code = 0;
        if (!decode_samehost_status(data + off, kSameHostStatusLen, code)) continue;
        unsigned char again[kSameHostStatusLen];
        encode_samehost_status(code, again);
        FUZZ_CHECK(std::memcmp(again, data + off, kSameHostStatusLen) == 0, "status does not re-encode");
    }
    return 0;
}
