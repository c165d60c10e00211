// The metadata stores (metadata/metadata_store.h): connection strings, the
// byte-level parsers (HTTP responses, RESP replies, base64), and the etcd
// and Redis clients against real servers started here (metadata_servers.h).
// The HTTP store talks to FAKE servers only: to see the exact requests it
// sends and for faults a real server cannot produce (its round trip against
// the real HTTP metadata server is tested from Rust).
#include <atomic>
#include <memory>
#include <thread>

#include "common/error.h"
#include "metadata/base64.h"
#include "metadata/http_client.h"
#include "metadata/metadata_store.h"
#include "metadata/stores.h"
#include "metadata_servers.h"
#include "test_util.h"

using namespace mcrs;
using namespace mdtest;

namespace {

MetadataStoreOptions fast_opts() {
    MetadataStoreOptions o;
    o.timeout_ms = 1500;
    o.connect_timeout_ms = 500;
    return o;
}

bool has(const std::string &s, const std::string &needle) { return s.find(needle) != std::string::npos; }

// The message of the Error that `f` throws ("" when it does not), its code
// in `code`.
template <class F>
std::string error_of(F &&f, int *code = nullptr) {
    try {
        f();
    } catch (const Error &e) {
        if (code) *code = e.code();
        return e.what();
    }
    return "";
}

// The bytes 0..255, repeated to `n` bytes.
std::string binary_value(size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + i / 256) & 0xff);
    return s;
}

HttpResponse parse(const std::string &bytes, const HttpLimits &lim = HttpLimits()) {
    return parse_http_response(bytes, lim, "test-server:1");
}

// The same bytes fed one at a time.
HttpResponse parse_bytewise(const std::string &bytes, const HttpLimits &lim = HttpLimits()) {
    HttpResponseParser p(lim, "test-server:1");
    for (char c : bytes)
        if (p.feed(&c, 1)) break;
    if (!p.done()) p.finish_eof();
    return std::move(p.response());
}

std::string parse_error(const std::string &bytes, const HttpLimits &lim = HttpLimits()) {
    return error_of([&] { parse(bytes, lim); });
}

std::string resp_error(const std::string &bytes, const RespLimits &lim = RespLimits()) {
    return error_of([&] {
        RespReply r;
        parse_resp_reply(bytes, lim, "127.0.0.1:1", r);
    });
}

}  // namespace

// ---- No server ---------------------------------------------------------------

TEST(metadata_store_connection_strings) {
    MetadataStoreOptions o = fast_opts();
    CHECK_EQ(make_metadata_store("etcd://127.0.0.1:2379", o)->describe(), std::string("etcd 127.0.0.1:2379"));
    CHECK_EQ(make_metadata_store("etcd://a:1,b:2", o)->describe(), std::string("etcd a:1,b:2"));
    CHECK_EQ(make_metadata_store("etcd://a:1;b:2", o)->describe(), std::string("etcd a:1,b:2"));
    CHECK_EQ(make_metadata_store("etcd://http://a:1, http://b:2/", o)->describe(), std::string("etcd a:1,b:2"));
    CHECK_EQ(make_metadata_store("a:1,HTTP://b:2", o)->describe(), std::string("etcd a:1,b:2"));
    CHECK_EQ(make_metadata_store("http://a:1;http://b:2", o)->describe(), std::string("etcd a:1,b:2"));
    CHECK(dynamic_cast<HttpStore *>(make_metadata_store("http://h:1/a,b;c", o).get()) != nullptr);
    CHECK_EQ(make_metadata_store("127.0.0.1", o)->describe(), std::string("etcd 127.0.0.1:2379"));
    CHECK_EQ(make_metadata_store("etcd://[::1]:2379,[fe80::1]", o)->describe(),
             std::string("etcd [::1]:2379,[fe80::1]:2379"));
    CHECK(dynamic_cast<EtcdStore *>(make_metadata_store("h:1", o).get()) != nullptr);
    CHECK_EQ(make_metadata_store("redis://127.0.0.1", o)->describe(), std::string("redis 127.0.0.1:12001"));
    CHECK_EQ(make_metadata_store("redis://h:6379", o)->describe(), std::string("redis h:6379"));
    CHECK(dynamic_cast<RedisStore *>(make_metadata_store("REDIS://h:6379/", o).get()) != nullptr);
    auto http = make_metadata_store("http://127.0.0.1:8080/metadata", o);
    CHECK_EQ(http->describe(), std::string("http://127.0.0.1:8080/metadata"));
    auto *hs = dynamic_cast<HttpStore *>(http.get());
    REQUIRE(hs != nullptr);
    // Escaped as curl_easy_escape does.
    CHECK_EQ(hs->target_for("mooncake/rpc_meta/a b+c&d?e:f"),
             std::string("/metadata?key=mooncake%2Frpc_meta%2Fa%20b%2Bc%26d%3Fe%3Af"));
    CHECK_EQ(url_escape("AZaz09-._~\x01\xff%"), std::string("AZaz09-._~%01%FF%25"));
    auto q = make_metadata_store("http://h/m?ns=x", o);
    CHECK_EQ(dynamic_cast<HttpStore *>(q.get())->target_for("k"), std::string("/m?ns=x&key=k"));
    CHECK_EQ(dynamic_cast<HttpStore *>(make_metadata_store("http://h:81", o).get())->target_for("k"),
             std::string("/?key=k"));

    int code = 0;
    std::string e = error_of([&] { make_metadata_store("https://h:443/metadata", o); }, &code);
    CHECK_EQ(code, int(kErrNotImplemented));
    CHECK(has(e, "TLS") && has(e, "proxy") && has(e, "http://"));
    code = 0;
    e = error_of([&] { make_metadata_store("etcd://a:1,https://b:2", o); }, &code);
    CHECK_EQ(code, int(kErrNotImplemented));
    code = 0;
    e = error_of([&] { make_metadata_store("ftp://h/x", o); }, &code);
    CHECK_EQ(code, int(kErrInvalidArgument));
    CHECK(has(e, "'ftp://'"));
    const char *bad[] = {"", "  ", "etcd://", "etcd://,;", "etcd://h:notaport", "etcd://h:70000", "etcd://h:1/path",
                         "redis://", "redis://h:x", "http://", "http://h:1 /x", "http://u@h/x", "http://h/x#f",
                         "http://::1/x", "etcd://a:1,ftp://b:2"};
    for (const char *b : bad) {
        code = 0;
        e = error_of([&] { make_metadata_store(b, o); }, &code);
        if (code != kErrInvalidArgument)
            mctest::record_failure(__FILE__, __LINE__, std::string("accepted or wrong code: '") + b + "': " + e);
    }
    MetadataStoreOptions db = o;
    db.redis_db = 256;
    CHECK(has(error_of([&] { make_metadata_store("redis://h:1", db); }, &code), "256"));
    CHECK_EQ(code, int(kErrInvalidArgument));
    db.redis_db = -1;
    CHECK(!error_of([&] { make_metadata_store("redis://h:1", db); }).empty());
    db.redis_db = 255;
    CHECK(error_of([&] { make_metadata_store("redis://h:1", db); }).empty());
}

// Names are resolved on a helper thread with a deadline (getaddrinfo has
// none); numeric addresses in place. Only names /etc/hosts answers: no
// test query leaves the machine.
TEST(metadata_store_bounded_name_resolution) {
    std::string err;
    AddrList v4 = resolve_tcp("127.0.0.1", 2379, 1000, err);
    REQUIRE(v4 != nullptr);
    CHECK_EQ(v4->ai_family, AF_INET);
    AddrList v6 = resolve_tcp("::1", 2379, 1000, err);
    REQUIRE(v6 != nullptr);
    CHECK_EQ(v6->ai_family, AF_INET6);
    auto t0 = Clock::now();
    AddrList named = resolve_tcp("localhost", 2379, 3000, err);
    CHECK(named != nullptr);
    CHECK(ms_since(t0) < 3500);
}

TEST(metadata_store_base64) {
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; ++i) {
        CHECK_EQ(base64_encode(plain[i]), std::string(coded[i]));
        std::string d;
        CHECK(base64_decode(coded[i], d));
        CHECK_EQ(d, std::string(plain[i]));
    }
    for (size_t n = 0; n < 300; n += 7) {
        std::string v = binary_value(n), d;
        CHECK(base64_decode(base64_encode(v), d));
        CHECK(d == v);
    }
    const char *bad[] = {"Zg=",  "Zg==Zg==", "Zh==", "Zm9=",  "Zm 9v", "Zm9v\n", "====", "Z===",
                         "Zm9v!A==", "=Zm9", "Zm=v", "Zg-_", "Zm9vY", "\xc3\xa9\xc3\xa9"};
    for (const char *b : bad) {
        std::string d;
        if (base64_decode(b, d)) mctest::record_failure(__FILE__, __LINE__, std::string("accepted: ") + b);
    }
}

TEST(metadata_store_http_response_parser) {
    struct Ok {
        const char *bytes;
        int status;
        const char *body;
    };
    const Ok ok[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200, "hello"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello-and-ignored-bytes", 200, "hello"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
         200, "hello world"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nContent-Length: 3\r\n\r\n00a \r\n0123456789\r\n0\r\n\r\n",
         200, "0123456789"},
        {"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nread to the end", 200, "read to the end"},
        {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nnot found", 404, "not found"},
        {"HTTP/1.1 200 OK\nContent-Length: 2\n\nab", 200, "ab"},
        {"\r\nHTTP/1.1 204 No Content\r\nContent-Length: 100\r\n\r\n", 204, ""},
        {"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 200, ""},
        {"HTTP/1.1 400 Bad Request\r\nContent-Length: 34\r\nContent-Length: 34\r\n\r\nDuplicate rpc_meta key not allowed",
         400, "Duplicate rpc_meta key not allowed"},
    };
    for (const Ok &c : ok) {
        for (int bytewise = 0; bytewise < 2; ++bytewise) {
            HttpResponse r;
            std::string e = error_of([&] { r = bytewise ? parse_bytewise(c.bytes) : parse(c.bytes); });
            if (!e.empty()) {
                mctest::record_failure(__FILE__, __LINE__, std::string("rejected: ") + c.bytes + ": " + e);
                continue;
            }
            CHECK_EQ(r.status, c.status);
            CHECK_EQ(r.body, std::string(c.body));
        }
    }
    HttpResponse h = parse("HTTP/1.1 200 OK\r\nX-Thing:  a b \r\nContent-Length: 0\r\n\r\n");
    REQUIRE(h.header("x-thing") != nullptr);
    CHECK_EQ(*h.header("x-thing"), std::string("a b"));
    CHECK_EQ(h.reason, std::string("OK"));

    struct Bad {
        std::string bytes;
        const char *says;
    };
    std::string many_headers = "HTTP/1.1 200 OK\r\n";
    for (int i = 0; i < 101; ++i) many_headers += "X-" + std::to_string(i) + ": v\r\n";
    const Bad bad[] = {
        {"", "closed the connection without answering"},
        {"garbage\r\n\r\n", "bad status line"},
        {"HTTP/1.1 2000 OK\r\n\r\n", "bad status line"},
        {"HTTP/1.1 099 X\r\n\r\n", "out of range"},
        {"HTTP/2 200 OK\r\n\r\n", "bad status line"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "5 more announced"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n", "too large"},
        {"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n", "bad Content-Length"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "bad Content-Length"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "conflicting Content-Length"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "unsupported transfer coding"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "unsupported transfer coding"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", "bad chunk size"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\n", "bad chunk size"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\n", "overflows"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffff\r\n", "too large"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", "no CRLF"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", "inside the chunked body"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(2000, '1'), "longer than"},
        {"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", "without a name"},
        {"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "bad header name"},
        {"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n", "folded"},
        {std::string("HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n", 26), "control character"},
        {"HTTP/1.1 200 OK\r\nX: " + std::string(17000, 'a') + "\r\n\r\n", "head larger than 16384"},
        {"HTTP/1.1 200 OK\r\nX: " + std::string(17000, 'a'), "head larger than 16384"},
        {many_headers + "\r\n", "more than 100 header lines"},
        {"HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"},
        {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
         "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n",
         "interim"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", "inside the response head"},
    };
    for (const Bad &c : bad) {
        for (int bytewise = 0; bytewise < 2; ++bytewise) {
            int code = 0;
            std::string e = error_of([&] { bytewise ? parse_bytewise(c.bytes) : parse(c.bytes); }, &code);
            if (!has(e, c.says) || code != kErrMetadata || !has(e, "test-server:1"))
                mctest::record_failure(__FILE__, __LINE__,
                                       "'" + excerpt_for_message(c.bytes, 60) + "' -> '" + e + "', expected '" + c.says + "'");
        }
    }
    // The body limit holds for every framing.
    HttpLimits small;
    small.max_body_bytes = 10;
    CHECK(has(parse_error("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", small), "too large"));
    CHECK(has(parse_error("HTTP/1.1 200 OK\r\n\r\n" + std::string(11, 'x'), small), "too large"));
    CHECK(has(parse_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n5\r\nabcde\r\n", small),
              "too large"));
    CHECK_EQ(parse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", small).body, std::string("0123456789"));
    // A streamed answer ends at the first complete object.
    HttpResponseParser p(HttpLimits(), "s");
    p.set_body_complete([](const std::string &b) { return b.find('}') != std::string::npos; });
    std::string stream = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n3\r\n\":1\r\n2\r\n}\n\r\n";
    CHECK(p.feed(stream.data(), stream.size()));
    CHECK_EQ(p.response().body, std::string("{\"a\":1}\n"));
}

TEST(metadata_store_resp_parser) {
    RespLimits lim;
    RespReply r;
    CHECK_EQ(parse_resp_reply("+OK\r\n", lim, "s", r), size_t(5));
    CHECK(r.type == RespReply::Type::Simple && r.str == "OK");
    CHECK_EQ(parse_resp_reply("-ERR bad thing\r\n+OK\r\n", lim, "s", r), size_t(16));
    CHECK(r.type == RespReply::Type::Error && r.str == "ERR bad thing");
    CHECK_EQ(parse_resp_reply(":-42\r\n", lim, "s", r), size_t(6));
    CHECK(r.type == RespReply::Type::Integer && r.integer == -42);
    CHECK_EQ(parse_resp_reply(std::string("$5\r\na\r\n\0b\r\n", 12), lim, "s", r), size_t(11));
    CHECK(r.type == RespReply::Type::Bulk && r.str == std::string("a\r\n\0b", 5));
    CHECK_EQ(parse_resp_reply("$0\r\n\r\n", lim, "s", r), size_t(6));
    CHECK(r.type == RespReply::Type::Bulk && r.str.empty());
    CHECK_EQ(parse_resp_reply("$-1\r\n", lim, "s", r), size_t(5));
    CHECK(r.type == RespReply::Type::Nil);
    CHECK_EQ(parse_resp_reply("*-1\r\n", lim, "s", r), size_t(5));
    CHECK(r.type == RespReply::Type::Nil);
    CHECK_EQ(parse_resp_reply("*3\r\n$1\r\na\r\n:1\r\n*1\r\n+x\r\n", lim, "s", r), size_t(23));
    REQUIRE(r.type == RespReply::Type::Array && r.elems.size() == 3);
    CHECK(r.elems[0].str == "a" && r.elems[1].integer == 1 && r.elems[2].elems.size() == 1);
    // Incomplete: more bytes needed, nothing thrown.
    for (const char *part : {"", "+OK", "+OK\r", "$5\r\nab", "$5\r\nabcde\r", "*2\r\n:1\r\n", ":12"})
        if (parse_resp_reply(part, lim, "s", r) != 0)
            mctest::record_failure(__FILE__, __LINE__, std::string("complete? ") + part);

    struct Bad {
        std::string bytes;
        const char *says;
    };
    const Bad bad[] = {
        {"hello\r\n", "unknown reply type"},
        {"$abc\r\n", "bad bulk length"},
        {"$-2\r\n", "negative bulk length"},
        {"$3\r\nabcd\r\n", "not followed by CRLF"},
        {"$99999999999\r\n", "over the limit"},
        {"*100\r\n", "over the limit"},
        {"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", "nested deeper"},
        {"+" + std::string(70000, 'a'), "longer than 65536"},
        {"+OK\n", "line feed without carriage return"},
        {"+OK\rX", "carriage return without line feed"},
        {":12345678901234567890\r\n", "bad integer"},
        {":9999999999999999999\r\n", "out of range"},
        {":\r\n", "bad integer"},
        {":1a\r\n", "bad integer"},
    };
    for (const Bad &c : bad) {
        std::string e = resp_error(c.bytes);
        if (!has(e, c.says) || !has(e, "malformed reply from redis 127.0.0.1:1"))
            mctest::record_failure(__FILE__, __LINE__, "'" + excerpt_for_message(c.bytes, 40) + "' -> '" + e + "'");
    }
}

// ---- HTTP store against FAKE servers -----------------------------------------

// The requests the HTTP store sends, seen by a FAKE server that answers as
// upstream's HTTP metadata server does (404 for unknown keys, 400 for a
// duplicate rpc_meta key), and how the store reads the answers.
TEST(metadata_store_http_requests_fake_server) {
    FakeServer fake(http_request_complete, [](const std::string &req) -> std::string {
        auto answer = [](const std::string &status, const std::string &body) {
            return "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        };
        if (has(req, "missing")) return answer("404 Not Found", "metadata not found");
        if (has(req, "dup")) return answer("400 Bad Request", "Duplicate rpc_meta key not allowed");
        if (has(req, "boom")) return answer("500 Internal Server Error", std::string("it\x01 broke\r\nbadly") + std::string(500, 'z'));
        if (req.compare(0, 4, "GET ") == 0)
            return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        return answer("200 OK", "metadata updated");
    });
    REQUIRE(fake.ok());
    const std::string base = "http://127.0.0.1:" + std::to_string(fake.port()) + "/metadata";
    auto store = make_metadata_store(base, fast_opts());
    const std::string key = "mooncake/rpc_meta/a b+c&d?e:f";
    std::string v;
    REQUIRE(store->get(key, v));
    CHECK_EQ(v, std::string("{\"a\":1}"));
    store->put(key, "{\"v\":1}");
    CHECK(store->remove(key));
    CHECK(!store->get("missing", v));
    CHECK(!store->remove("missing"));
    auto got = fake.received();
    REQUIRE(got.size() >= 3);
    const std::string escaped = "/metadata?key=mooncake%2Frpc_meta%2Fa%20b%2Bc%26d%3Fe%3Af";
    CHECK_EQ(got[0].substr(0, got[0].find("\r\n")), "GET " + escaped + " HTTP/1.1");
    CHECK(has(got[0], "\r\nHost: 127.0.0.1:" + std::to_string(fake.port()) + "\r\n"));
    CHECK(has(got[0], "\r\nConnection: close\r\n"));
    CHECK_EQ(got[1].substr(0, got[1].find("\r\n")), "PUT " + escaped + " HTTP/1.1");
    CHECK(has(got[1], "\r\nContent-Type: application/json\r\n"));
    CHECK(has(got[1], "\r\nContent-Length: 7\r\n"));
    // The value exactly, no newline added.
    CHECK_EQ(got[1].substr(got[1].find("\r\n\r\n") + 4), std::string("{\"v\":1}"));
    CHECK_EQ(got[2].substr(0, got[2].find("\r\n")), "DELETE " + escaped + " HTTP/1.1");

    int code = 0;
    std::string e = error_of([&] { store->put("mooncake/rpc_meta/dup", "{}"); }, &code);
    CHECK_EQ(code, int(kErrMetadata));
    CHECK(has(e, "400") && has(e, "Duplicate rpc_meta key not allowed") && has(e, base));
    e = error_of([&] { store->get("boom", v); });
    CHECK(has(e, "500") && has(e, "it? broke badly") && has(e, "...") && !has(e, "\r"));
    CHECK(e.size() < 600);
}

// Faults that only a FAKE server produces, each bounded in time.
TEST(metadata_store_http_faults_fake_server) {
    MetadataStoreOptions o = fast_opts();
    o.timeout_ms = 500;
    struct Case {
        std::string reply;
        bool hang;
        const char *says;
    };
    const Case cases[] = {
        {"SMTP ready\r\n\r\n", false, "bad status line"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", false, "too large"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1x2\r\n", false, "bad chunk size"},
        {"", false, "closed the connection without answering"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", false, "97 more announced"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", true, "before the deadline"},
        {"HTTP/1.1 200 OK\r\n", true, "before the deadline"},
    };
    for (const Case &c : cases) {
        FakeServer fake(http_request_complete, [&](const std::string &) { return c.reply; }, c.hang);
        REQUIRE(fake.ok());
        auto store = make_metadata_store("http://127.0.0.1:" + std::to_string(fake.port()) + "/m", o);
        std::string v;
        auto t0 = Clock::now();
        int code = 0;
        std::string e = error_of([&] { store->get("k", v); }, &code);
        long long ms = ms_since(t0);
        if (!has(e, c.says) || code != kErrMetadata || !has(e, "127.0.0.1:" + std::to_string(fake.port())) ||
            ms > o.timeout_ms + 1000)
            mctest::record_failure(__FILE__, __LINE__,
                                   "reply '" + excerpt_for_message(c.reply, 40) + "': '" + e + "' after " +
                                       std::to_string(ms) + " ms");
    }
    // Accepts and never answers: bounded by timeout_ms.
    {
        FakeServer silent([](const std::string &) { return false; }, [](const std::string &) { return ""; });
        REQUIRE(silent.ok());
        auto store = make_metadata_store("http://127.0.0.1:" + std::to_string(silent.port()) + "/m", o);
        auto t0 = Clock::now();
        std::string e = error_of([&] { store->put("k", "v"); });
        long long ms = ms_since(t0);
        CHECK(has(e, "before the deadline"));
        CHECK(ms >= o.timeout_ms - 50 && ms < o.timeout_ms + 1000);
    }
    // Nobody listening.
    {
        uint16_t port = free_port();
        auto store = make_metadata_store("http://127.0.0.1:" + std::to_string(port) + "/m", o);
        std::string v;
        std::string e = error_of([&] { store->get("k", v); });
        CHECK(has(e, "cannot connect"));
    }
}

// ---- etcd ----------------------------------------------------------------------

TEST(metadata_store_etcd_roundtrip) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    auto store = make_metadata_store("etcd://" + etcd.endpoint(), fast_opts());
    CHECK_EQ(store->describe(), "etcd " + etcd.endpoint());
    std::string v;
    CHECK(!store->get("mooncake/ram/missing", v));
    store->put("mooncake/ram/seg", "{\"name\":\"seg\"}");
    REQUIRE(store->get("mooncake/ram/seg", v));
    CHECK_EQ(v, std::string("{\"name\":\"seg\"}\n"));
    // What etcd holds: the value and a newline, as upstream's writers store.
    std::string raw;
    REQUIRE(etcd_raw_get(etcd.port(), "mooncake/ram/seg", raw));
    CHECK_EQ(raw, std::string("{\"name\":\"seg\"}\n"));
    std::string ctl = which("etcdctl");
    if (!ctl.empty()) {
        std::string out;
        int rc = run_capture("ETCDCTL_API=3 '" + ctl + "' --endpoints=http://" + etcd.endpoint() +
                                 " get mooncake/ram/seg --print-value-only 2>/dev/null",
                             out);
        CHECK_EQ(rc, 0);
        // etcdctl prints the stored value and then its own newline.
        CHECK_EQ(out, std::string("{\"name\":\"seg\"}\n\n"));
    }
    // A value etcd holds without the newline (another writer) comes back as is.
    std::string body = "{\"key\":\"" + base64_encode("plain") + "\",\"value\":\"" + base64_encode("x") + "\"}";
    REQUIRE_EQ(http_to(etcd.port(), "POST", "/v3/kv/put", &body).status, 200);
    REQUIRE(store->get("plain", v));
    CHECK_EQ(v, std::string("x"));
    // Binary, empty and large values; odd keys.
    const std::string big = binary_value(1 << 20);
    store->put("bin/\x01\xff key", big);
    REQUIRE(store->get("bin/\x01\xff key", v));
    CHECK(v == big + "\n");
    store->put("empty", "");
    REQUIRE(store->get("empty", v));
    CHECK_EQ(v, std::string("\n"));
    // A reader with a smaller limit refuses the large value.
    MetadataStoreOptions small = fast_opts();
    small.max_value_bytes = 1000;
    auto limited = make_metadata_store("etcd://" + etcd.endpoint(), small);
    CHECK(has(error_of([&] { limited->get("bin/\x01\xff key", v); }), "too large"));
    CHECK(limited->get("empty", v));
    CHECK(store->remove("mooncake/ram/seg"));
    CHECK(!store->remove("mooncake/ram/seg"));
    CHECK(!store->get("mooncake/ram/seg", v));
    // Several threads at once on one store.
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            try {
                for (int i = 0; i < 10; ++i) {
                    std::string k = "conc/" + std::to_string(t) + "/" + std::to_string(i), got;
                    store->put(k, "v" + std::to_string(i));
                    if (!store->get(k, got) || got != "v" + std::to_string(i) + "\n") ++bad;
                    if (!store->remove(k)) ++bad;
                }
            } catch (const std::exception &e) {
                std::fprintf(stderr, "    thread: %s\n", e.what());
                ++bad;
            }
        });
    for (auto &t : ts) t.join();
    CHECK_EQ(bad.load(), 0);
}

TEST(metadata_store_etcd_down_and_restart) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    MetadataStoreOptions o = fast_opts();
    auto store = make_metadata_store("etcd://" + etcd.endpoint(), o);
    store->put("k", "before");
    etcd.kill_now();
    std::string v;
    auto t0 = Clock::now();
    int code = 0;
    std::string e = error_of([&] { store->get("k", v); }, &code);
    CHECK(ms_since(t0) < o.timeout_ms + 2000);
    CHECK_EQ(code, int(kErrMetadata));
    CHECK(has(e, etcd.endpoint()));
    CHECK(!error_of([&] { store->put("k", "x"); }).empty());
    // Same port and data directory: the value is still there.
    REQUIRE(etcd.start());
    REQUIRE(store->get("k", v));
    CHECK_EQ(v, std::string("before\n"));
    store->put("k", "after");
    REQUIRE(store->get("k", v));
    CHECK_EQ(v, std::string("after\n"));
}

namespace {

// Four concurrent lookups while the real server hangs (SIGSTOP: its kernel
// still accepts connections, nothing answers). Calls take turns on the
// store's connection, and each must still end within its own timeout, not
// after the calls queued ahead of it; after SIGCONT the store answers
// again (no reply meant for a timed-out call is taken for a later one).
template <class Server>
void concurrent_calls_while_hung(Server &server, const std::string &conn) {
    MetadataStoreOptions o = fast_opts();
    auto store = make_metadata_store(conn, o);
    store->put("k", "v");
    server.pause();
    std::atomic<long long> worst{0};
    std::atomic<int> metadata_errors{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
        threads.emplace_back([&] {
            auto t0 = Clock::now();
            std::string v;
            int code = 0;
            error_of([&] { store->get("k", v); }, &code);
            if (code == int(kErrMetadata)) metadata_errors++;
            long long ms = ms_since(t0), w = worst.load();
            while (ms > w && !worst.compare_exchange_weak(w, ms)) {
            }
        });
    for (auto &t : threads) t.join();
    server.resume();
    CHECK_EQ(metadata_errors.load(), 4);
    CHECK(worst.load() < o.timeout_ms + 1000);
    std::string v;
    REQUIRE(store->get("k", v));
    CHECK_EQ(v, std::string("v\n"));
}

}  // namespace

TEST(metadata_store_etcd_concurrent_calls_while_hung) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    concurrent_calls_while_hung(etcd, "etcd://" + etcd.endpoint());
}

TEST(metadata_store_redis_concurrent_calls_while_hung) {
    std::string bin = server_binary("redis-server");
    if (bin.empty()) return;
    RedisServer redis(bin, "");
    REQUIRE(redis.start());
    concurrent_calls_while_hung(redis, redis.url());
}

namespace {

// The member that leads (by /v3/maintenance/status), -1 when unknown.
int etcd_leader(const std::vector<std::unique_ptr<EtcdMember>> &ms) {
    for (size_t i = 0; i < ms.size(); ++i) {
        std::string body = "{}";
        HttpResponse r = http_to(ms[i]->client_port, "POST", "/v3/maintenance/status", &body);
        if (r.status != 200) continue;
        try {
            Json j = Json::parse(r.body);
            const Json *h = j.find("header");
            if (h && json_string_or(*h, "member_id", "a") == json_string_or(j, "leader", "b")) return int(i);
        } catch (const std::exception &) {
        }
    }
    return -1;
}

}  // namespace

TEST(metadata_store_etcd_cluster_failover) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    mctest::TmpDir tmp;
    std::vector<std::unique_ptr<EtcdMember>> ms;
    std::string cluster;
    for (int i = 0; i < 3; ++i) {
        ms.push_back(std::make_unique<EtcdMember>("m" + std::to_string(i), tmp.path()));
        cluster += (i ? "," : "") + ms[i]->name + "=" + ms[i]->peer_url();
    }
    for (auto &m : ms) REQUIRE(m->start(bin, cluster, fast_election()));
    for (auto &m : ms) REQUIRE(m->wait_healthy(15000));
    MetadataStoreOptions o = fast_opts();
    o.timeout_ms = 4000;  // room for an election after the leader dies
    auto store = make_metadata_store("etcd://" + ms[0]->endpoint() + "," + ms[1]->endpoint() + "," + ms[2]->endpoint(), o);
    store->put("k", "v1");
    // Kill the leader (the harder case: the others must elect a new one)
    // and name it first in every list below.
    int leader = etcd_leader(ms);
    if (leader < 0) leader = 0;
    EtcdMember &dead = *ms[leader];
    std::vector<std::string> alive;
    for (int i = 0; i < 3; ++i)
        if (i != leader) alive.push_back(ms[i]->endpoint());
    dead.kill_now();
    std::string v;
    auto t0 = Clock::now();
    auto first_dead =
        make_metadata_store("etcd://" + dead.endpoint() + "," + alive[0] + "," + alive[1], o);
    first_dead->put("k", "v2");
    std::fprintf(stderr, "    (leader m%d killed; the next put took %lld ms)\n", leader, ms_since(t0));
    CHECK(ms_since(t0) < o.timeout_ms);
    REQUIRE(first_dead->get("k", v));
    CHECK_EQ(v, std::string("v2\n"));
    // The store made before the kill goes on working.
    REQUIRE(store->get("k", v));
    CHECK_EQ(v, std::string("v2\n"));
    // No "etcd://", http:// on each endpoint, ';' between them.
    auto plain = make_metadata_store("http://" + dead.endpoint() + ";http://" + alive[0] + ";http://" + alive[1], o);
    auto plain2 = make_metadata_store(dead.endpoint() + ";" + alive[0] + "," + alive[1], o);
    REQUIRE(plain->get("k", v));
    CHECK_EQ(v, std::string("v2\n"));
    REQUIRE(plain2->get("k", v));
    // A first member that accepts and never answers (FAKE) leaves time
    // for the others.
    FakeServer silent([](const std::string &) { return false; }, [](const std::string &) { return ""; });
    REQUIRE(silent.ok());
    MetadataStoreOptions o2 = fast_opts();
    auto behind_silent = make_metadata_store(
        "etcd://127.0.0.1:" + std::to_string(silent.port()) + "," + alive[0] + "," + alive[1], o2);
    t0 = Clock::now();
    REQUIRE(behind_silent->get("k", v));
    CHECK(ms_since(t0) < o2.timeout_ms);
    CHECK(behind_silent->remove("k"));
    // Everything dead: an error within the deadline naming every endpoint.
    for (auto &m : ms) m->kill_now();
    t0 = Clock::now();
    std::string e = error_of([&] { first_dead->get("k", v); });
    CHECK(ms_since(t0) < o.timeout_ms + 2000);
    CHECK(has(e, alive[0]) && has(e, alive[1]) && has(e, dead.endpoint()));
}

TEST(metadata_store_etcd_lease) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    MetadataStoreOptions o = fast_opts();
    o.lease_ttl_s = 2;
    const std::string conn = "etcd://" + etcd.endpoint();
    auto a = make_metadata_store(conn, o);
    auto b = make_metadata_store(conn, o);
    a->put("lease/a", "va");
    b->put("lease/b", "vb");
    auto *eb = dynamic_cast<EtcdStore *>(b.get());
    REQUIRE(eb != nullptr);
    const int64_t lease_b = eb->lease_id_for_test();
    CHECK(lease_b != 0);
    // Attached to the lease; readers see the plain value.
    std::string body = "{\"key\":\"" + base64_encode("lease/b") + "\"}";
    HttpResponse r = http_to(etcd.port(), "POST", "/v3/kv/range", &body);
    CHECK(has(r.body, "\"lease\":\"" + std::to_string(lease_b) + "\""));
    std::string v;
    // A store without a lease reads the same values.
    auto reader = make_metadata_store(conn, fast_opts());
    REQUIRE(reader->get("lease/a", v));
    CHECK_EQ(v, std::string("va\n"));
    // Kept alive well past the TTL.
    sleep_ms(5000);
    CHECK(reader->get("lease/a", v));
    CHECK(reader->get("lease/b", v));
    // The lease revoked behind the store's back: its keep-alive notices, a
    // new lease comes and the key is put again.
    std::string revoke = "{\"ID\":\"" + std::to_string(lease_b) + "\"}";
    REQUIRE_EQ(http_to(etcd.port(), "POST", "/v3/lease/revoke", &revoke).status, 200);
    CHECK(!reader->get("lease/b", v));
    CHECK(wait_until(3000, [&] { return reader->get("lease/b", v); }));
    CHECK_EQ(v, std::string("vb\n"));
    CHECK(eb->lease_id_for_test() != lease_b && eb->lease_id_for_test() != 0);
    // Destroyed: the lease is revoked and the key goes at once.
    auto t0 = Clock::now();
    a.reset();
    CHECK(ms_since(t0) < 1000);
    CHECK(!reader->get("lease/a", v));
    // Crashed (no revoke): the key goes after the TTL.
    eb->simulate_crash_for_test();
    CHECK(reader->get("lease/b", v));
    t0 = Clock::now();
    CHECK(wait_until(int(o.lease_ttl_s) * 1000 + 2000, [&] { return !reader->get("lease/b", v); }));
    CHECK(ms_since(t0) > 500);
    b.reset();
}

// ---- Redis ---------------------------------------------------------------------

TEST(metadata_store_redis_roundtrip) {
    std::string bin = server_binary("redis-server");
    if (bin.empty()) return;
    RedisServer redis(bin, "pw-test");
    REQUIRE(redis.start());
    MetadataStoreOptions o = fast_opts();
    o.redis_password = "pw-test";
    auto store = make_metadata_store(redis.url(), o);
    CHECK_EQ(store->describe(), "redis 127.0.0.1:" + std::to_string(redis.port()));
    std::string v;
    CHECK(!store->get("mooncake/ram/missing", v));
    store->put("mooncake/ram/seg", "{\"name\":\"seg\"}");
    REQUIRE(store->get("mooncake/ram/seg", v));
    CHECK_EQ(v, std::string("{\"name\":\"seg\"}\n"));
    RespReply raw;
    REQUIRE(redis.raw({"GET", "mooncake/ram/seg"}, raw));
    CHECK(raw.type == RespReply::Type::Bulk && raw.str == "{\"name\":\"seg\"}\n");
    REQUIRE(redis.raw({"TTL", "mooncake/ram/seg"}, raw));
    CHECK_EQ(raw.integer, int64_t(-1));  // no lease: no expiry
    const std::string big = binary_value(1 << 20);
    store->put("bin\r\n\x01 key", big);
    REQUIRE(store->get("bin\r\n\x01 key", v));
    CHECK(v == big + "\n");
    MetadataStoreOptions small = o;
    small.max_value_bytes = 1000;
    auto limited = make_metadata_store(redis.url(), small);
    CHECK(has(error_of([&] { limited->get("bin\r\n\x01 key", v); }), "malformed reply from redis"));
    CHECK(limited->get("mooncake/ram/seg", v));  // a new connection after the bad one
    CHECK(store->remove("mooncake/ram/seg"));
    CHECK(!store->remove("mooncake/ram/seg"));
    CHECK(!store->get("mooncake/ram/seg", v));
    // With the user name too.
    MetadataStoreOptions user = o;
    user.redis_username = "default";
    CHECK(!make_metadata_store(redis.url(), user)->get("nothing", v));
    // Wrong or missing password.
    MetadataStoreOptions wrong = o;
    wrong.redis_password = "nope";
    int code = 0;
    std::string e = error_of([&] { make_metadata_store(redis.url(), wrong)->get("k", v); }, &code);
    CHECK_EQ(code, int(kErrMetadata));
    CHECK(has(e, "authentication failed"));
    MetadataStoreOptions none = o;
    none.redis_password.clear();
    e = error_of([&] { make_metadata_store(redis.url(), none)->get("k", v); });
    CHECK(has(e, "authentication required"));
    none.redis_db = 3;
    e = error_of([&] { make_metadata_store(redis.url(), none)->get("k", v); });
    CHECK(has(e, "SELECT 3 refused: authentication required"));
    // Database index: keys of db 3 are not in db 0.
    MetadataStoreOptions db3 = o;
    db3.redis_db = 3;
    auto s3 = make_metadata_store(redis.url(), db3);
    s3->put("in-db-3", "x");
    REQUIRE(s3->get("in-db-3", v));
    CHECK(!store->get("in-db-3", v));
    REQUIRE(redis.raw({"GET", "in-db-3"}, raw, 3));
    CHECK(raw.type == RespReply::Type::Bulk && raw.str == "x\n");
    REQUIRE(redis.raw({"GET", "in-db-3"}, raw, 0));
    CHECK(raw.type == RespReply::Type::Nil);
    // Several threads at once on one store (one connection).
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            try {
                for (int i = 0; i < 25; ++i) {
                    std::string k = "conc/" + std::to_string(t) + "/" + std::to_string(i), got;
                    store->put(k, "v" + std::to_string(i));
                    if (!store->get(k, got) || got != "v" + std::to_string(i) + "\n") ++bad;
                    if (!store->remove(k)) ++bad;
                }
            } catch (const std::exception &ex) {
                std::fprintf(stderr, "    thread: %s\n", ex.what());
                ++bad;
            }
        });
    for (auto &t : ts) t.join();
    CHECK_EQ(bad.load(), 0);
}

TEST(metadata_store_redis_down_and_restart) {
    std::string bin = server_binary("redis-server");
    if (bin.empty()) return;
    RedisServer redis(bin, "");
    REQUIRE(redis.start());
    MetadataStoreOptions o = fast_opts();
    auto store = make_metadata_store(redis.url(), o);
    store->put("k", "v");
    redis.kill_now();
    std::string v;
    auto t0 = Clock::now();
    int code = 0;
    std::string e = error_of([&] { store->get("k", v); }, &code);
    CHECK(ms_since(t0) < o.timeout_ms + 2000);
    CHECK_EQ(code, int(kErrMetadata));
    CHECK(has(e, "127.0.0.1:" + std::to_string(redis.port())));
    // Restarted (empty: no persistence): the store reconnects by itself.
    REQUIRE(redis.start());
    CHECK(!store->get("k", v));
    store->put("k", "again");
    REQUIRE(store->get("k", v));
    CHECK_EQ(v, std::string("again\n"));
    // A restart between two calls: the broken connection is replaced
    // within the call.
    redis.kill_now();
    REQUIRE(redis.start());
    CHECK(!store->get("k", v));
}

TEST(metadata_store_redis_lease) {
    std::string bin = server_binary("redis-server");
    if (bin.empty()) return;
    RedisServer redis(bin, "pw");
    REQUIRE(redis.start());
    MetadataStoreOptions o = fast_opts();
    o.redis_password = "pw";
    o.lease_ttl_s = 1;
    auto a = make_metadata_store(redis.url(), o);
    auto b = make_metadata_store(redis.url(), o);
    a->put("lease/a", "va");
    b->put("lease/b", "vb");
    RespReply raw;
    REQUIRE(redis.raw({"TTL", "lease/a"}, raw));
    CHECK(raw.type == RespReply::Type::Integer && raw.integer >= 0 && raw.integer <= 1);
    MetadataStoreOptions plain = o;
    plain.lease_ttl_s = 0;
    auto reader = make_metadata_store(redis.url(), plain);
    std::string v;
    REQUIRE(reader->get("lease/a", v));
    CHECK_EQ(v, std::string("va\n"));
    // Kept alive well past the TTL.
    sleep_ms(3000);
    CHECK(reader->get("lease/a", v));
    CHECK(reader->get("lease/b", v));
    // Deleted behind the store's back: written again by the refresh.
    REQUIRE(redis.raw({"DEL", "lease/b"}, raw));
    CHECK(wait_until(2000, [&] { return reader->get("lease/b", v); }));
    CHECK_EQ(v, std::string("vb\n"));
    // Destroyed: its keys go at once (as an etcd lease revoke does) -- but
    // not a value someone else wrote meanwhile.
    a->put("lease/other", "mine");
    reader->put("lease/other", "theirs");
    auto t0 = Clock::now();
    a.reset();
    CHECK(ms_since(t0) < 1000);
    CHECK(!reader->get("lease/a", v));
    CHECK(reader->get("lease/other", v));
    // Crashed: the key goes after the TTL.
    auto *rb = dynamic_cast<RedisStore *>(b.get());
    REQUIRE(rb != nullptr);
    rb->simulate_crash_for_test();
    CHECK(reader->get("lease/b", v));
    CHECK(wait_until(int(o.lease_ttl_s) * 1000 + 2000, [&] { return !reader->get("lease/b", v); }));
    b.reset();
}

// Replies only a FAKE server sends: garbage, a huge bulk length, silence.
TEST(metadata_store_redis_faults_fake_server) {
    MetadataStoreOptions o = fast_opts();
    o.timeout_ms = 500;
    auto command_complete = [](const std::string &s) { return s.size() >= 4 && s.compare(s.size() - 2, 2, "\r\n") == 0 && s.find("k\r\n") != std::string::npos; };
    struct Case {
        std::string reply;
        const char *says;
    };
    const Case cases[] = {
        {"hello\r\n", "malformed reply from redis"},
        {"$99999999999\r\n", "malformed reply from redis"},
        {"$3\r\nabcde\r\n", "malformed reply from redis"},
        {":1\r\n", "unexpected integer reply to GET"},
        {"-ERR boom\r\n", "GET failed: ERR boom"},
        {"", "connection lost"},
    };
    for (const Case &c : cases) {
        FakeServer fake(command_complete, [&](const std::string &) { return c.reply; });
        REQUIRE(fake.ok());
        auto store = make_metadata_store("redis://127.0.0.1:" + std::to_string(fake.port()), o);
        std::string v;
        auto t0 = Clock::now();
        std::string e = error_of([&] { store->get("k", v); });
        if (!has(e, c.says) || ms_since(t0) > o.timeout_ms + 1000)
            mctest::record_failure(__FILE__, __LINE__, "reply '" + excerpt_for_message(c.reply, 40) + "': '" + e + "'");
    }
    FakeServer silent([](const std::string &) { return false; }, [](const std::string &) { return ""; });
    REQUIRE(silent.ok());
    auto store = make_metadata_store("redis://127.0.0.1:" + std::to_string(silent.port()), o);
    std::string v;
    auto t0 = Clock::now();
    std::string e = error_of([&] { store->get("k", v); });
    long long ms = ms_since(t0);
    CHECK(has(e, "no answer to GET within 500 ms"));
    CHECK(ms >= o.timeout_ms - 50 && ms < o.timeout_ms + 1000);
}
