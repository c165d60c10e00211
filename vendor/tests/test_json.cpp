#include "common/error.h"
#include "common/json.h"
#include "test_util.h"

using mcrs::Error;
using mcrs::Json;

static bool parse_fails(const std::string &s) {
    try {
        Json::parse(s);
        return false;
    } catch (const Error &e) {
        return e.code() == mcrs::kErrMalformedJson;
    }
}

TEST(json_roundtrip_sorted_compact) {
    Json j = Json::parse(R"( {"b": [1, -2, 3.5, true, null], "a": "x\ny\u00e9"} )");
    CHECK_EQ(j.dump(), std::string("{\"a\":\"x\\ny\xc3\xa9\",\"b\":[1,-2,3.5,true,null]}"));
}

TEST(json_exact_u64) {
    Json j = Json::parse("{\"addr\":18446744073709551615,\"n\":-9223372036854775808}");
    uint64_t u = 0;
    CHECK(j.find("addr")->get_u64(u));
    CHECK_EQ(u, UINT64_MAX);
    int64_t i = 0;
    CHECK(j.find("n")->get_i64(i));
    CHECK_EQ(i, INT64_MIN);
    CHECK(!j.find("n")->get_u64(u));
    // Beyond 64 bits it is a double and no longer an exact integer.
    Json big = Json::parse("18446744073709551616");
    CHECK(!big.get_u64(u));
}

TEST(json_surrogate_pairs) {
    Json j = Json::parse("\"\\ud83d\\ude00\"");
    CHECK_EQ(*j.get_string(), std::string("\xf0\x9f\x98\x80"));
    CHECK(parse_fails("\"\\ud83d\""));
    CHECK(parse_fails("\"\\ude00\""));
}

TEST(json_rejects_garbage) {
    const char *bad[] = {"", "{", "}", "{\"a\"}", "{\"a\":}", "[1,]", "01", "1.", "-",
                         "tru", "\"abc", "{\"a\":1} x", "\x04{}", "not json", "[\"\x01\"]",
                         "{1:2}", "\"\\q\""};
    for (const char *b : bad) {
        if (!parse_fails(b)) mctest::record_failure(__FILE__, __LINE__, std::string("accepted: ") + b);
    }
}

TEST(json_depth_limit) {
    std::string deep(100, '[');
    deep += std::string(100, ']');
    CHECK(parse_fails(deep));
    std::string ok(60, '[');
    ok += std::string(60, ']');
    CHECK(!parse_fails(ok));
}

TEST(json_trailing_newline_accepted) {
    Json j = Json::parse("{\"status\":\"success\"}\n");
    CHECK_EQ(mcrs::json_string_or(j, "status", ""), std::string("success"));
}
