// The TCP data server fed a whole hostile byte stream: request headers
// (READ/WRITE, v1/v2, any size and address), payloads, garbage, truncation.
// The bytes go to the engine's data port verbatim, then our FIN; the
// registered buffers sit at fixed addresses (fuzz_engine.h) so seeds and
// mutations can hit them, their edges, the local-only buffer and the guard
// pages. Findings: any sanitizer report, a guard or local-only byte
// changed, a server that does not close after our FIN, and any difference
// from a model of the protocol: requests take effect in order; each READ
// inside the remote buffer answers (v2: an OK frame, then) the bytes as
// they are at that point of the stream; a WRITE lands its payload (v2: OK);
// the first request outside the remote buffer gets REJECTED (v2) and the
// connection closes; requests complete before our FIN are all answered.
// A WRITE cut short by our FIN was never acknowledged: any prefix of the
// bytes that did arrive may have landed (large payloads stream into the
// buffer, small ones wait whole in the read-ahead buffer and land none).
// (The same-host opcodes are not served on this port: they follow the
// generic rule, "not WRITE means READ".)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_engine.h"
#include "transport/tcp/tcp_wire.h"

namespace {

unsigned char pattern(size_t i) { return static_cast<unsigned char>(i * 7); }

struct Expected {
    std::string reply;
    bool prefix_only = false;  // the stream ended inside a WRITE payload
    std::string memory;        // the remote buffer afterwards, truncated WRITE not applied
    size_t cut_off = 0;        // where the truncated WRITE starts in the buffer
    std::string cut_bytes;     // the part of its payload that arrived
};

// The buffer equals the model, except that inside the truncated WRITE's
// range some prefix of the arrived bytes may have landed.
bool memory_matches(const Expected &x, const unsigned char *mem) {
    const size_t n = x.cut_bytes.size();
    if (std::memcmp(mem, x.memory.data(), x.cut_off) != 0) return false;
    const size_t tail = x.cut_off + n;
    if (std::memcmp(mem + tail, x.memory.data() + tail, x.memory.size() - tail) != 0) return false;
    // Some k with mem[0, k) new and mem[k, n) old exists iff the longest
    // new prefix reaches the start of the longest old suffix.
    const unsigned char *m = mem + x.cut_off;
    size_t newer = 0;
    while (newer < n && m[newer] == static_cast<unsigned char>(x.cut_bytes[newer])) ++newer;
    size_t older = n;
    while (older > 0 && m[older - 1] == static_cast<unsigned char>(x.memory[x.cut_off + older - 1]))
        --older;
    return older <= newer;
}

Expected model(const uint8_t *data, size_t size) {
    using namespace mcrs;
    Expected x;
    x.memory.resize(fuzz::kRemoteLen);
    for (size_t i = 0; i < fuzz::kRemoteLen; ++i) x.memory[i] = static_cast<char>(pattern(i));
    const uint64_t base = reinterpret_cast<uint64_t>(fuzz::remote_buf());
    auto status = [&](uint32_t code) {
        unsigned char st[8];
        put_le64(st, encode_tcp_status(code));
        x.reply.append(reinterpret_cast<const char *>(st), 8);
    };
    size_t pos = 0;
    while (size - pos >= kTcpHeaderLen) {
        TcpHeader h = decode_tcp_header(data + pos);
        pos += kTcpHeaderLen;
        const bool v2 = tcp_is_v2(h.opcode);
        const bool inside = h.size != 0 && h.addr >= base && h.size <= fuzz::kRemoteLen &&
                            h.addr - base <= fuzz::kRemoteLen - h.size;
        if (!inside) {
            if (v2) status(kTcpStatusRejected);
            return x;
        }
        const size_t off = static_cast<size_t>(h.addr - base), len = static_cast<size_t>(h.size);
        if (!tcp_is_write(h.opcode)) {
            if (v2) status(kTcpStatusOk);
            x.reply.append(x.memory, off, len);
            continue;
        }
        size_t got = size - pos < len ? size - pos : len;
        if (got < len) {
            x.prefix_only = true;
            x.cut_off = off;
            x.cut_bytes.assign(reinterpret_cast<const char *>(data + pos), got);
            return x;
        }
        x.memory.replace(off, got, reinterpret_cast<const char *>(data + pos), got);
        pos += got;
        if (v2) status(kTcpStatusOk);
    }
    return x;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz::Engine &e = fuzz::engine();
    // Same starting contents for every input.
    for (size_t i = 0; i < fuzz::kRemoteLen; ++i) fuzz::remote_buf()[i] = pattern(i);
    size_t threads = fuzz::thread_count();
    std::string reply = fuzz::exchange(e.data_port, data, size, 15000);
    // The server closed: its connection thread is on its way out.
    fuzz::settle_threads(threads);
    if (std::getenv("MC_FUZZ_LOG")) {
        std::fprintf(stderr, "reply: %zu bytes:", reply.size());
        for (size_t i = 0; i < reply.size() && i < 64; ++i)
            std::fprintf(stderr, " %02x", static_cast<unsigned char>(reply[i]));
        std::fprintf(stderr, "\n");
    }
    fuzz::check_canaries();
    Expected x = model(data, size);
    if (x.prefix_only)
        FUZZ_CHECK(reply.size() <= x.reply.size() && x.reply.compare(0, reply.size(), reply) == 0,
                   "the answers differ from the protocol model");
    else
        FUZZ_CHECK(reply == x.reply, "the answers differ from the protocol model");
    FUZZ_CHECK(memory_matches(x, fuzz::remote_buf()),
               "the remote buffer differs from the protocol model");
    return 0;
}
