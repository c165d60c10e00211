// The initiator's decoding of a target's 8-byte v2 status frames
// (decode_tcp_status, what the TCP client applies to every answer). Input =
// the frames a hostile target sends back to back. A frame is valid exactly
// when it carries the magic, and then re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_check.h"
#include "transport/tcp/tcp_wire.h"

using namespace mcrs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (size_t off = 0; off + 8 <= size; off += 8) {
        TcpStatus s = decode_tcp_status(data + off);
        bool magic = data[off + 4] == 'V' && data[off + 5] == 'T' && data[off + 6] == 'C' &&
                     data[off + 7] == 'M';
        FUZZ_CHECK(s.valid == magic, "magic check");
        if (!s.valid) continue;
        unsigned char again[8];
        put_le64(again, encode_tcp_status(s.code));
        FUZZ_CHECK(std::memcmp(again, data + off, 8) == 0, "status does not re-encode");
    }
    return 0;
}
