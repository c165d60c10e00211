// Frames, descriptors, names and TCP headers against the byte layouts that
// upstream engines put on the wire (recorded from upstream captures).
#include <cstring>

#include "common/error.h"
#include "common/host_port.h"
#include "core/segment_descriptor.h"
#include "handshake/frame.h"
#include "test_util.h"
#include "transport/tcp/tcp_wire.h"

using namespace mcrs;

TEST(frame_probe_bytes_match_capture) {
    std::string f = encode_frame(kHsProbe, "{}\n");
    const unsigned char expect[] = {0x04, 0, 0, 0, 0, 0, 0, 0, 0x03, '{', '}', '\n'};
    REQUIRE_EQ(f.size(), sizeof expect);
    CHECK(std::memcmp(f.data(), expect, sizeof expect) == 0);
    CHECK_EQ(decode_frame_length(reinterpret_cast<const unsigned char *>(f.data())), 4u);
}

TEST(frame_old_protocol_has_no_type_byte) {
    std::string f = encode_frame(kHsOldProtocol, "{\"a\":1}");
    CHECK_EQ(decode_frame_length(reinterpret_cast<const unsigned char *>(f.data())), 7u);
    CHECK_EQ(f[8], '{');
    const std::string body = f.substr(8);
    FrameBody b = split_frame_body(body);
    CHECK_EQ(static_cast<int>(b.type), 0xFF);
    const std::string typed_body("\x02{}", 3);
    FrameBody typed = split_frame_body(typed_body);
    CHECK_EQ(static_cast<int>(typed.type), 2);
    CHECK(typed.json == "{}");
    // Type byte 4..0xFE is legacy framing whose JSON then fails to parse.
    const std::string four_body("\x04{}", 3);
    FrameBody four = split_frame_body(four_body);
    CHECK_EQ(static_cast<int>(four.type), 0xFF);
}

TEST(tcp_header_matches_capture) {
    TcpHeader h;
    h.size = 4096;
    h.addr = 0x7f08b46fd010ull;
    h.opcode = kTcpOpRead | kTcpV2Flag;
    unsigned char out[kTcpHeaderLen];
    encode_tcp_header(h, out);
    const unsigned char expect[] = {0x00, 0x10, 0, 0, 0, 0, 0, 0, 0x10, 0xd0, 0x6f, 0xb4,
                                    0x08, 0x7f, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0};
    CHECK(std::memcmp(out, expect, sizeof expect) == 0);
    TcpHeader back = decode_tcp_header(out);
    CHECK_EQ(back.size, 4096u);
    CHECK_EQ(back.addr, 0x7f08b46fd010ull);
    CHECK(tcp_is_v2(back.opcode));
    CHECK(!tcp_is_write(back.opcode));
    CHECK(!tcp_is_write(0x82));  // anything but WRITE is READ
    unsigned char st[8];
    put_le64(st, encode_tcp_status(kTcpStatusOk));
    const unsigned char ok[] = {0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d};
    CHECK(std::memcmp(st, ok, 8) == 0);
    put_le64(st, encode_tcp_status(kTcpStatusRejected));
    CHECK_EQ(static_cast<int>(st[0]), 1);
}

TEST(host_port_rules) {
    CHECK_EQ(parse_host_port("127.0.0.1:16302").host, std::string("127.0.0.1"));
    CHECK_EQ(parse_host_port("127.0.0.1:16302").port, 16302);
    CHECK_EQ(parse_host_port("node1").port, kDefaultHandshakePort);
    CHECK_EQ(parse_host_port("node1:notaport").port, kDefaultHandshakePort);
    CHECK_EQ(parse_host_port("node1:99999").port, kDefaultHandshakePort);
    CHECK_EQ(parse_host_port("[::1]:15001").host, std::string("::1"));
    CHECK_EQ(parse_host_port("[::1]:15001").port, 15001);
    CHECK_EQ(parse_host_port("fe80::1").host, std::string("fe80::1"));
    CHECK_EQ(parse_host_port("fe80::1").port, kDefaultHandshakePort);
    CHECK_EQ(join_host_port("::1", 15001), std::string("[::1]:15001"));
    CHECK_EQ(join_host_port("10.0.0.1", 1), std::string("10.0.0.1:1"));
}

TEST(descriptor_decodes_wheel_capture) {
    const char *wheel =
        "{\"buffers\":[{\"addr\":139675363692560,\"length\":1048576,\"name\":\"127.0.0.1:16302\"}],"
        "\"name\":\"127.0.0.1:16302\",\"protocol\":\"tcp\",\"rdma_server_name\":\"\","
        "\"tcp_data_host\":\"127.0.0.1\",\"tcp_data_port\":16961,\"tcp_proto_version\":2,"
        "\"timestamp\":\"2026-12-02 08:13:46.110448\"}\n";
    SegmentDesc d = decode_segment_desc(Json::parse(wheel));
    CHECK_EQ(d.name, std::string("127.0.0.1:16302"));
    CHECK_EQ(d.protocol, std::string("tcp"));
    CHECK_EQ(d.tcp_data_host, std::string("127.0.0.1"));
    CHECK_EQ(d.tcp_data_port, 16961);
    CHECK_EQ(d.tcp_proto_version, 2);
    REQUIRE_EQ(d.buffers.size(), 1u);
    CHECK_EQ(d.buffers[0].addr, 139675363692560ull);
    CHECK_EQ(d.buffers[0].length, 1048576u);
}

TEST(descriptor_roundtrip_and_defaults) {
    SegmentDesc d;
    d.name = "127.0.0.1:15000";
    d.protocol = "tcp";
    d.tcp_data_host = "127.0.0.1";
    d.tcp_data_port = 15001;
    d.tcp_proto_version = 2;
    d.buffers.push_back(BufferDesc{"cpu:0", 0x1000, 4096, {}, {}});
    Json j = encode_segment_desc(d);
    CHECK(j.find("timestamp") != nullptr);
    CHECK(j.find("lkey") == nullptr);
    SegmentDesc back = decode_segment_desc(Json::parse(j.dump()));
    CHECK_EQ(back.tcp_data_port, 15001);
    CHECK_EQ(back.buffers[0].name, std::string("cpu:0"));
    // No tcp_proto_version: legacy peer, version 1.
    SegmentDesc v1 = decode_segment_desc(
        Json::parse("{\"name\":\"h:1\",\"protocol\":\"tcp\",\"tcp_data_port\":5,\"buffers\":[]}"));
    CHECK_EQ(v1.tcp_proto_version, 1);
}

static bool desc_rejected(const char *text) {
    try {
        decode_segment_desc(Json::parse(text));
        return false;
    } catch (const Error &e) {
        return e.code() == kErrMetadata;
    }
}

TEST(descriptor_rejects_bad_fields) {
    CHECK(desc_rejected("null"));
    CHECK(desc_rejected("[]"));
    CHECK(desc_rejected("{\"protocol\":\"tcp\"}"));
    CHECK(desc_rejected("{\"name\":\"a\"}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":0,\"length\":1,\"name\":\"x\"}]}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":1,\"length\":0,\"name\":\"x\"}]}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":1,\"length\":1,\"name\":\"\"}]}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":18446744073709551615,\"length\":2,\"name\":\"x\"}]}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"tcp\",\"tcp_data_port\":70000}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"tcp\",\"buffers\":{}}"));
    CHECK(desc_rejected("{\"name\":\"a\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"d\",\"gid\":\"g\"}],"
                        "\"buffers\":[{\"addr\":1,\"length\":1,\"name\":\"x\",\"lkey\":[1,2],\"rkey\":[1,2]}]}"));
    CHECK(!desc_rejected("{\"name\":\"a\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"d\",\"gid\":\"g\"}],"
                         "\"buffers\":[{\"addr\":1,\"length\":1,\"name\":\"x\",\"lkey\":[1],\"rkey\":[1]}]}"));
}
