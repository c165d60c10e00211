// The metadata stores' HTTP response parser (metadata/http_client.cpp) on
// arbitrary bytes, as a hostile etcd gateway or HTTP metadata server could
// send them: it either throws mcrs::Error or returns a response within the
// limits; feeding the same bytes in pieces gives the same outcome. Also
// the strict base64 decoder (etcd values) and the message excerpts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"
#include "fuzz_check.h"
#include "metadata/base64.h"
#include "metadata/http_client.h"

using namespace mcrs;

namespace {

struct Outcome {
    bool ok = false;
    HttpResponse resp;
};

Outcome whole(std::string_view in, const HttpLimits &lim) {
    Outcome o;
    try {
        o.resp = parse_http_response(in, lim, "fuzz:1");
        o.ok = true;
    } catch (const Error &e) {
        FUZZ_CHECK(e.code() == kErrMetadata, e.what());
    }
    return o;
}

// Fed in pieces of `step` bytes (the last piece shorter), then EOF.
Outcome pieces(std::string_view in, const HttpLimits &lim, size_t step) {
    Outcome o;
    try {
        HttpResponseParser p(lim, "fuzz:1");
        bool done = false;
        for (size_t i = 0; i < in.size() && !done; i += step)
            done = p.feed(in.data() + i, std::min(step, in.size() - i));
        if (!done) p.finish_eof();
        o.resp = std::move(p.response());
        o.ok = true;
    } catch (const Error &e) {
        FUZZ_CHECK(e.code() == kErrMetadata, e.what());
    }
    return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view in(reinterpret_cast<const char *>(data), size);
    HttpLimits lim;
    lim.max_head_bytes = 2048;
    lim.max_body_bytes = 4096;
    lim.max_header_lines = 16;
    lim.max_interim = 2;

    Outcome a = whole(in, lim);
    if (a.ok) {
        FUZZ_CHECK(a.resp.status >= 200 && a.resp.status <= 599, "interim or out-of-range status returned");
        FUZZ_CHECK(a.resp.body.size() <= lim.max_body_bytes, "body over the limit");
        FUZZ_CHECK(a.resp.headers.size() <= lim.max_header_lines, "too many headers kept");
        for (const auto &h : a.resp.headers)
            for (char c : h.second) FUZZ_CHECK(c != '\r' && c != '\n' && c != '\0', "control byte in a header value");
    }
    const size_t steps[] = {1, 7, static_cast<size_t>(1 + (size ? data[0] % 64 : 0))};
    for (size_t step : steps) {
        if (step == 1 && size > 4096) continue;  // keep each input fast
        Outcome b = pieces(in, lim, step);
        FUZZ_CHECK(a.ok == b.ok, "whole and piecewise parsing disagree on success");
        if (a.ok) {
            FUZZ_CHECK(a.resp.status == b.resp.status, "whole and piecewise status differ");
            FUZZ_CHECK(a.resp.body == b.resp.body, "whole and piecewise bodies differ");
            FUZZ_CHECK(a.resp.headers == b.resp.headers, "whole and piecewise headers differ");
        }
    }

    // base64: whatever decodes is canonical; everything round-trips.
    std::string dec;
    if (base64_decode(in, dec)) FUZZ_CHECK(base64_encode(dec) == in, "accepted a non-canonical base64 text");
    FUZZ_CHECK(base64_decode(base64_encode(in), dec) && dec == in, "base64 round trip");

    // Excerpts are short and printable.
    std::string ex = excerpt_for_message(in, 100);
    FUZZ_CHECK(ex.size() <= 103, "excerpt too long");
    for (char c : ex) FUZZ_CHECK(c >= 0x20 && c < 0x7f, "unprintable byte in an excerpt");
    return 0;
}
