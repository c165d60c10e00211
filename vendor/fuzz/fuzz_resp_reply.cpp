// The Redis store's RESP2 reply parser (metadata/redis_store.cpp) on
// arbitrary bytes, as a hostile server could send them: it throws
// mcrs::Error, asks for more bytes (0), or returns one reply within the
// limits; every shorter prefix of a complete reply asks for more bytes,
// and a reply written out again parses to the same value.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"
#include "fuzz_check.h"
#include "metadata/stores.h"

using namespace mcrs;

namespace {

void encode(const RespReply &r, std::string &out) {
    switch (r.type) {
        case RespReply::Type::Simple: out += "+" + r.str + "\r\n"; break;
        case RespReply::Type::Error: out += "-" + r.str + "\r\n"; break;
        case RespReply::Type::Integer: out += ":" + std::to_string(r.integer) + "\r\n"; break;
        case RespReply::Type::Bulk: out += "$" + std::to_string(r.str.size()) + "\r\n" + r.str + "\r\n"; break;
        case RespReply::Type::Nil: out += "$-1\r\n"; break;
        case RespReply::Type::Array:
            out += "*" + std::to_string(r.elems.size()) + "\r\n";
            for (const auto &e : r.elems) encode(e, out);
            break;
    }
}

bool same(const RespReply &a, const RespReply &b) {
    if (a.type != b.type || a.str != b.str || a.integer != b.integer || a.elems.size() != b.elems.size())
        return false;
    for (size_t i = 0; i < a.elems.size(); ++i)
        if (!same(a.elems[i], b.elems[i])) return false;
    return true;
}

size_t depth_of(const RespReply &r) {
    size_t d = 0;
    for (const auto &e : r.elems) d = std::max(d, depth_of(e));
    return r.type == RespReply::Type::Array ? d + 1 : d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view in(reinterpret_cast<const char *>(data), size);
    RespLimits lim;
    lim.max_bulk_bytes = 4096;
    lim.max_line_bytes = 256;
    lim.max_array_elems = 8;
    lim.max_depth = 3;
    RespReply r;
    size_t used = 0;
    try {
        used = parse_resp_reply(in, lim, "fuzz:1", r);
    } catch (const Error &e) {
        FUZZ_CHECK(e.code() == kErrMetadata, e.what());
        return 0;
    }
    if (used == 0) return 0;
    FUZZ_CHECK(used <= size, "consumed more than the input");
    FUZZ_CHECK(depth_of(r) <= static_cast<size_t>(lim.max_depth), "nesting over the limit");
    if (r.type == RespReply::Type::Bulk) FUZZ_CHECK(r.str.size() <= lim.max_bulk_bytes, "bulk over the limit");
    // Shorter prefixes ask for more, without an error.
    for (size_t cut : {used - 1, used / 2, size_t(1)}) {
        if (cut >= used) continue;
        RespReply p;
        size_t u = 1;
        try {
            u = parse_resp_reply(in.substr(0, cut), lim, "fuzz:1", p);
        } catch (const Error &e) {
            FUZZ_CHECK(false, e.what());
        }
        FUZZ_CHECK(u == 0, "a prefix of a reply parsed as complete");
    }
    // Exactly the reply's bytes are enough.
    RespReply again;
    FUZZ_CHECK(parse_resp_reply(in.substr(0, used), lim, "fuzz:1", again) == used, "reply bytes alone");
    FUZZ_CHECK(same(r, again), "same bytes, different reply");
    std::string out;
    encode(r, out);
    RespReply back;
    size_t u2 = 0;
    try {
        u2 = parse_resp_reply(out, lim, "fuzz:1", back);
    } catch (const Error &e) {
        FUZZ_CHECK(false, e.what());
    }
    FUZZ_CHECK(u2 == out.size() && same(r, back), "re-encoded reply differs");
    return 0;
}
