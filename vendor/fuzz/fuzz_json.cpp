// Json::parse on arbitrary bytes: it either throws mcrs::Error or returns a
// value; whatever it accepts, the writer's text parses again and reaches a
// fixed point after one round (the first round may normalise, e.g. -0 to 0).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/json.h"
#include "fuzz_check.h"

using mcrs::Json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    Json v;
    try {
        v = Json::parse(text);
    } catch (const mcrs::Error &) {
        return 0;
    }
    // The nesting bound also holds with a small limit.
    try {
        Json::parse(text, 2);
    } catch (const mcrs::Error &) {
    }
    std::string d1 = v.dump();
    Json v2, v3;
    try {
        v2 = Json::parse(d1);
    } catch (const mcrs::Error &e) {
        FUZZ_CHECK(false, e.what());
    }
    std::string d2 = v2.dump();
    try {
        v3 = Json::parse(d2);
    } catch (const mcrs::Error &e) {
        FUZZ_CHECK(false, e.what());
    }
    FUZZ_CHECK(v3.dump() == d2, "dump/parse is not a fixed point");
    // The accessors never throw and agree with the type.
    uint64_t u;
    int64_t i;
    bool b;
    if (v.get_u64(u)) FUZZ_CHECK(v.is_number(), "get_u64 on a non-number");
    if (v.get_i64(i)) FUZZ_CHECK(v.is_number(), "get_i64 on a non-number");
    if (v.get_bool(b)) FUZZ_CHECK(v.is_bool(), "get_bool on a non-bool");
    if (const Json::Object *o = v.get_object())
        for (const auto &kv : *o) FUZZ_CHECK(v.find(kv.first) != nullptr, "find misses a key");
    return 0;
}
