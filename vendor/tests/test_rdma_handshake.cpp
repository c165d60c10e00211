#include "common/error.h"
#include "test_util.h"
#include "transport/rdma/handshake_desc.h"

using namespace mcrs::rdma;
using mcrs::Error;
using mcrs::Json;

namespace {

const char *kGid = "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01";
const std::string kOwnServer = "10.0.0.1:15000";
const std::string kOwnPath = "10.0.0.1:15000@mlx5_0";
const std::string kPeerPath = "10.0.0.2:16000@mlx5_1";

HandShakeDesc decode_text(const std::string &s) { return decode_handshake(Json::parse(s)); }

}  // namespace

TEST(rdma_handshake_encode_exact) {
    HandShakeDesc r = make_request(kPeerPath, kOwnPath, 0, kGid, {0x123, 0xFFFFFF});
    CHECK_EQ(encode_handshake(r).dump(),
             std::string("{\"local_gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\","
                         "\"local_lid\":0,\"local_nic_path\":\"10.0.0.2:16000@mlx5_1\",\"payload\":\"\","
                         "\"peer_nic_path\":\"10.0.0.1:15000@mlx5_0\",\"qp_num\":[291,16777215],"
                         "\"ready_ack\":false,\"reply_msg\":\"\"}"));
    HandShakeDesc ack = make_ack(r);
    CHECK(ack.is_ack());
    CHECK(encode_handshake(ack).dump().find("\"ready_ack\":true") != std::string::npos);
    // The TCP-only reply, byte for byte (docs/wire-protocol.md, Handshake port).
    CHECK_EQ(encode_handshake(empty_handshake()).dump(),
             std::string("{\"local_gid\":\"\",\"local_lid\":0,\"local_nic_path\":\"\",\"payload\":\"\","
                         "\"peer_nic_path\":\"\",\"qp_num\":[],\"reply_msg\":\"\"}"));
    // Optional notify keys only when set.
    HandShakeDesc n = r;
    n.notify_qp_num = 77;
    n.ctrl_channel = true;
    std::string t = encode_handshake(n).dump();
    CHECK(t.find("\"notify_qp_num\":77") != std::string::npos);
    CHECK(t.find("\"ctrl_channel\":true") != std::string::npos);
    CHECK(t.find("notify_rq_depth") == std::string::npos);
    CHECK(encode_handshake(r).dump().find("notify") == std::string::npos);
}

TEST(rdma_handshake_roundtrip) {
    HandShakeDesc r = make_request(kPeerPath, kOwnPath, 17, kGid, {1, 2, 3});
    r.notify_rq_depth = 64;
    HandShakeDesc b = decode_text(encode_handshake(r).dump() + "\n");
    CHECK_EQ(b.local_nic_path, r.local_nic_path);
    CHECK_EQ(b.peer_nic_path, r.peer_nic_path);
    CHECK_EQ(b.local_gid, r.local_gid);
    CHECK_EQ(b.local_lid, 17u);
    CHECK(b.qp_num == r.qp_num);
    CHECK(b.supports_ready_ack());
    CHECK(!b.is_ack());
    CHECK_EQ(b.notify_rq_depth, 64u);
    CHECK(b.decode_problem.empty());
}

TEST(rdma_handshake_lenient_decode) {
    // Everything missing.
    HandShakeDesc e = decode_text("{}");
    CHECK(handshake_is_empty(e));
    CHECK(!e.supports_ready_ack());
    CHECK(e.decode_problem.empty());
    // Wrong types become defaults.
    HandShakeDesc w = decode_text(
        "{\"local_gid\":5,\"local_lid\":\"7\",\"local_nic_path\":[],\"payload\":null,"
        "\"peer_nic_path\":{},\"qp_num\":\"1,2\",\"reply_msg\":false,\"ready_ack\":\"yes\","
        "\"notify_qp_num\":-1,\"ctrl_channel\":1}");
    CHECK(handshake_is_empty(w));
    CHECK(w.supports_ready_ack());  // presence is what counts
    CHECK(!w.is_ack());             // only the boolean true marks the ACK
    CHECK_EQ(w.notify_qp_num, 0u);
    CHECK(!w.ctrl_channel);
    CHECK(w.decode_problem.empty());
    struct {
        const char *lid;
        uint32_t want;
    } lids[] = {{"0", 0}, {"65535", 65535}, {"65536", 0}, {"-1", 0}, {"1.5", 0}, {"3.0", 3},
                {"true", 0}, {"18446744073709551615", 0}};
    for (const auto &c : lids) {
        HandShakeDesc d = decode_text(std::string("{\"local_lid\":") + c.lid + "}");
        if (d.local_lid != c.want)
            mctest::record_failure(__FILE__, __LINE__, std::string("lid ") + c.lid);
    }
    HandShakeDesc ack = decode_text("{\"ready_ack\":true}");
    CHECK(ack.is_ack());
    // Not an object: the only thing that throws.
    for (const char *s : {"[]", "null", "\"x\"", "3"}) {
        bool threw = false;
        try {
            decode_text(s);
        } catch (const Error &err) {
            threw = err.code() == mcrs::kErrMalformedJson;
        }
        if (!threw) mctest::record_failure(__FILE__, __LINE__, std::string("accepted ") + s);
    }
}

TEST(rdma_handshake_hostile_qp_lists) {
    struct {
        std::string json;
        const char *problem;
    } cases[] = {
        {"{\"qp_num\":[16777216]}", "qp_num[0] is not a 24-bit QP number"},
        {"{\"qp_num\":[1,-2]}", "qp_num[1]"},
        {"{\"qp_num\":[1,\"2\"]}", "qp_num[1]"},
        {"{\"qp_num\":[1.5]}", "qp_num[0]"},
        {"{\"qp_num\":[[1]]}", "qp_num[0]"},
        {"{\"qp_num\":[4294967297]}", "qp_num[0]"},
    };
    for (const auto &c : cases) {
        HandShakeDesc d = decode_text(c.json);
        if (d.decode_problem.find(c.problem) == std::string::npos || !d.qp_num.empty())
            mctest::record_failure(__FILE__, __LINE__, "hostile qp list not flagged: " + c.json);
    }
    std::string huge = "{\"qp_num\":[";
    for (int i = 0; i < 100000; ++i) huge += (i ? ",1" : "1");
    huge += "]}";
    HandShakeDesc h = decode_text(huge);
    CHECK(h.qp_num.empty());
    CHECK(h.decode_problem.find("100000 entries") != std::string::npos);
    // 255 is the most an endpoint may have, and is fine.
    std::string ok = "{\"qp_num\":[";
    for (int i = 0; i < 255; ++i) ok += (i ? "," : "") + std::to_string(i + 100);
    ok += "]}";
    CHECK_EQ(decode_text(ok).qp_num.size(), size_t(255));
    // A flagged request is rejected by the passive side.
    HandShakeDesc bad = decode_text("{\"qp_num\":[16777216,1],\"peer_nic_path\":\"" + kOwnPath +
                                    "\",\"local_nic_path\":\"" + kPeerPath + "\"}");
    PassiveDecision pd = check_passive_request(bad, kOwnServer, {"mlx5_0"}, 2, {});
    CHECK(pd.action == PassiveAction::Reject);
    CHECK(pd.reply_msg.find("24-bit") != std::string::npos);
}

TEST(rdma_handshake_nic_path_split) {
    std::string s, d;
    CHECK(split_nic_path("10.0.0.1:15000@mlx5_0", s, d));
    CHECK_EQ(s, std::string("10.0.0.1:15000"));
    CHECK_EQ(d, std::string("mlx5_0"));
    CHECK(split_nic_path("a@b@c", s, d));  // the last '@' separates
    CHECK_EQ(s, std::string("a@b"));
    CHECK_EQ(d, std::string("c"));
    for (const char *bad : {"", "@", "x@", "@y", "noat"}) CHECK(!split_nic_path(bad, s, d));
    CHECK_EQ(make_nic_path("h:1", "m"), std::string("h:1@m"));
}

TEST(rdma_handshake_passive_rules) {
    std::vector<std::string> devs = {"mlx5_0", "mlx5_1"};
    std::vector<uint32_t> qps = {100, 101};
    HandShakeDesc req = make_request(kPeerPath, kOwnPath, 0, kGid, qps);
    EndpointView none;
    EndpointView connected{EndpointState::Connected, kPeerPath, qps};
    EndpointView waiting{EndpointState::WaitReadyAck, kPeerPath, qps};
    EndpointView other_qps{EndpointState::Connected, kPeerPath, {7, 8}};

    PassiveDecision d = check_passive_request(req, kOwnServer, devs, 2, none);
    CHECK(d.action == PassiveAction::Connect);
    CHECK(d.wait_for_ack);  // the request carried ready_ack
    CHECK_EQ(d.local_device, std::string("mlx5_0"));
    CHECK(!d.gid_from_descriptor);

    HandShakeDesc old = req;
    old.ready_ack.reset();  // an older peer without the ACK step
    old.local_gid.clear();
    d = check_passive_request(old, kOwnServer, devs, 2, none);
    CHECK(d.action == PassiveAction::Connect);
    CHECK(!d.wait_for_ack);
    CHECK(d.gid_from_descriptor);

    CHECK(check_passive_request(req, kOwnServer, devs, 2, connected).action == PassiveAction::Reuse);
    d = check_passive_request(req, kOwnServer, devs, 2, waiting);
    CHECK(d.action == PassiveAction::Reuse);
    CHECK(d.wait_for_ack);
    d = check_passive_request(req, kOwnServer, devs, 2, other_qps);
    CHECK(d.action == PassiveAction::Rebuild);
    CHECK(d.wait_for_ack);

    // ACKs.
    HandShakeDesc ack = make_ack(req);
    CHECK(check_passive_request(ack, kOwnServer, devs, 2, waiting).action == PassiveAction::AckAccepted);
    CHECK(check_passive_request(ack, kOwnServer, devs, 2, connected).action == PassiveAction::AckAccepted);
    d = check_passive_request(ack, kOwnServer, devs, 2, other_qps);
    CHECK(d.action == PassiveAction::Reject);
    CHECK(d.reply_msg.find("stale ready ACK") != std::string::npos);
    CHECK(d.reply_msg.find("[100,101]") != std::string::npos);
    d = check_passive_request(ack, kOwnServer, devs, 2, none);
    CHECK(d.action == PassiveAction::Reject);
    CHECK(d.reply_msg.find("no endpoint is waiting") != std::string::npos);

    // Rejections.
    struct Bad {
        const char *what;
        HandShakeDesc r;
        const char *needle;
    };
    auto with = [&](auto fn) {
        HandShakeDesc x = req;
        fn(x);
        return x;
    };
    Bad bad[] = {
        {"qp count", with([](HandShakeDesc &x) { x.qp_num = {1, 2, 3}; }),
         "QP count mismatch: the peer's endpoint has 3 QP(s), ours has 2; set MC_NUM_QP_PER_EP"},
        {"no qps", with([](HandShakeDesc &x) { x.qp_num.clear(); }), "QP count mismatch"},
        {"other server", with([](HandShakeDesc &x) { x.peer_nic_path = "10.9.9.9:1@mlx5_0"; }),
         "does not belong to"},
        {"unknown device", with([](HandShakeDesc &x) { x.peer_nic_path = kOwnServer + "@mlx5_9"; }),
         "device \"mlx5_9\" not found"},
        {"malformed target", with([](HandShakeDesc &x) { x.peer_nic_path = "garbage"; }),
         "malformed peer_nic_path"},
        {"malformed source", with([](HandShakeDesc &x) { x.local_nic_path = ""; }),
         "malformed local_nic_path"},
        {"bad gid", with([](HandShakeDesc &x) { x.local_gid = "fe:80"; }), "is not a GID"},
        {"control chars", with([](HandShakeDesc &x) { x.peer_nic_path = std::string("a\x01\n@b"); }),
         "\"a??@b\""},
    };
    for (const auto &b : bad) {
        PassiveDecision r = check_passive_request(b.r, kOwnServer, devs, 2, none);
        if (r.action != PassiveAction::Reject || r.reply_msg.find(b.needle) == std::string::npos)
            mctest::record_failure(__FILE__, __LINE__,
                                   std::string("not rejected as ") + b.what + ": " + r.reply_msg);
    }
    // An endpoint built for another path is an inconsistency, not a reuse.
    EndpointView wrong{EndpointState::Connected, "10.0.0.3:1@mlx5_0", qps};
    CHECK(check_passive_request(req, kOwnServer, devs, 2, wrong).action == PassiveAction::Reject);
    // Long hostile strings are cut in the reply.
    HandShakeDesc longp = with([](HandShakeDesc &x) { x.peer_nic_path = std::string(100000, 'z'); });
    PassiveDecision lr = check_passive_request(longp, kOwnServer, devs, 2, none);
    CHECK(lr.reply_msg.size() < 400);
}

TEST(rdma_handshake_active_rules) {
    std::vector<uint32_t> theirs = {200, 201};
    HandShakeDesc reply = make_request(kPeerPath, kOwnPath, 0, kGid, theirs);  // peer's own view
    // Our side is kOwnPath talking to kPeerPath.
    ActiveCheck c = check_active_reply(reply, kOwnPath, kPeerPath, 2);
    CHECK(c.ok);
    CHECK(c.send_ready_ack);
    HandShakeDesc noack = reply;
    noack.ready_ack.reset();
    CHECK(!check_active_reply(noack, kOwnPath, kPeerPath, 2).send_ready_ack);

    struct {
        const char *what;
        HandShakeDesc r;
        const char *needle;
    } bad[] = {
        {"rejected", reject_handshake("QP count mismatch"), "peer rejected it: \"QP count mismatch\""},
        {"tcp only", empty_handshake(), "no RDMA transport"},
        {"wrong source", make_request("10.0.0.2:16000@mlx5_7", kOwnPath, 0, kGid, theirs), "the reply comes from"},
        {"wrong dest", make_request(kPeerPath, "10.0.0.1:15000@mlx5_3", 0, kGid, theirs), "addressed to"},
        {"qp count", make_request(kPeerPath, kOwnPath, 0, kGid, {1}), "QP count mismatch"},
        {"gid", make_request(kPeerPath, kOwnPath, 0, "zz", theirs), "is not a GID"},
    };
    for (const auto &b : bad) {
        ActiveCheck r = check_active_reply(b.r, kOwnPath, kPeerPath, 2);
        if (r.ok || r.error.find(b.needle) == std::string::npos ||
            r.error.find(kPeerPath) == std::string::npos)
            mctest::record_failure(__FILE__, __LINE__, std::string("active check ") + b.what + ": " + r.error);
    }
    HandShakeDesc flagged = decode_text("{\"qp_num\":[99999999]}");
    CHECK(!check_active_reply(flagged, kOwnPath, kPeerPath, 2).ok);
    CHECK(check_ack_reply(empty_handshake()).ok);
    ActiveCheck st = check_ack_reply(reject_handshake("stale ready ACK"));
    CHECK(!st.ok);
    CHECK(st.error.find("stale ready ACK") != std::string::npos);
    CHECK_EQ(reject_handshake("").reply_msg, std::string("Handshake callback failed"));
}
