// The endpoint handshake (docs/wire-protocol.md, RDMA endpoint handshake)
// against real transports over softverbs: the ready-ACK timeout on both
// sides (injected, well under a
// second) and the passive side taking an empty local_gid from the
// requester's published descriptor.
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "core/segment_descriptor.h"
#include "engine_fixture.h"
#include "handshake/frame.h"
#include "handshake/handshake_server.h"
#include "rdma_engine_fixture.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/handshake_desc.h"
#include "transport/rdma/rdma_transport.h"

using namespace mcrs::rdma;
using rdmatest::EnvGuard;
using rdmatest::rdma_cfg;
using rdmatest::run_one;
namespace ibv = mcrs::ibv;

namespace {

std::string gid_text(const svtest::Dev &d) {
    Gid g{};
    std::memcpy(g.data(), &d.gid, g.size());
    return format_gid(g);
}

RdmaTransportOptions direct_opts(const std::string &server, const std::string &nic) {
    RdmaTransportOptions o;
    o.server_name = server;
    o.allow = {nic};
    o.verbs_library = svtest::softverbs_path();
    return o;
}

HandShakeDesc call(RdmaTransport &t, const HandShakeDesc &d) {
    return decode_handshake(t.handle_connection(encode_handshake(d)));
}

}  // namespace

TEST(rdma_ready_ack_timeout_passive_tears_down) {
    svtest::configure("sv0:roce,sv2:roce");
    RdmaTransportOptions o = direct_opts("127.0.0.1:40001", "sv2");
    o.ready_ack_timeout_ms = 200;
    RdmaTransport b(o);
    svtest::Dev d0("sv0");
    svtest::Qp q1(d0), q2(d0);
    HandShakeDesc req = make_request("127.0.0.1:40002@sv0", "127.0.0.1:40001@sv2", d0.port.lid, gid_text(d0),
                                     {q1.qp->qp_num, q2.qp->qp_num});
    HandShakeDesc rep = call(b, req);
    CHECK(rep.reply_msg.empty());
    CHECK_EQ(rep.qp_num.size(), 2u);
    // No ACK within 200 ms: the endpoint is gone and a late ACK is refused.
    std::this_thread::sleep_for(std::chrono::milliseconds(450));
    HandShakeDesc late = call(b, make_ack(req));
    CHECK(!late.reply_msg.empty());
    // In time: accepted.
    rep = call(b, req);
    CHECK(rep.reply_msg.empty());
    HandShakeDesc ok = call(b, make_ack(req));
    CHECK(ok.reply_msg.empty());
    // Connected endpoints are not swept.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    rep = call(b, req);  // the same QPs again: reuse, not a new endpoint
    CHECK(rep.reply_msg.empty());
}

TEST(rdma_ready_ack_timeout_active_unresponsive_peer) {
    svtest::configure("sv0:roce,sv2:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard retry("MC_RETRY_CNT", "2");
    std::string err;
    uint16_t port = 0;
    mcrs::Fd lfd = mcrs::listen_tcp_random("127.0.0.1", 15000, 17000, 500, 16, port, err);
    REQUIRE(lfd.valid());
    std::string name = "127.0.0.1:" + std::to_string(port);
    RdmaTransport b(direct_opts(name, "sv2"));
    std::vector<char> src(4096), dst(4096);
    b.register_region(reinterpret_cast<uint64_t>(dst.data()), dst.size(), -1, true, "cpu:0");
    mcrs::SegmentDesc desc;
    desc.name = name;
    mcrs::BufferDesc bd;
    bd.name = "cpu:0";
    bd.addr = reinterpret_cast<uint64_t>(dst.data());
    bd.length = dst.size();
    desc.buffers.push_back(bd);
    b.fill_descriptor(desc);
    // A peer that serves its descriptor and the handshake but never
    // answers the ready ACK.
    std::atomic<int> acks{0};
    mcrs::HandshakeServer srv(std::move(lfd), mcrs::HandshakeServerOptions{},
                              [&](uint8_t type, const mcrs::Json &req, mcrs::Json &reply) {
                                  if (type == mcrs::kHsMetadata) {
                                      reply = mcrs::encode_segment_desc(desc);
                                      return true;
                                  }
                                  if (type != mcrs::kHsConnection) return false;
                                  if (decode_handshake(req).is_ack()) {
                                      ++acks;
                                      std::this_thread::sleep_for(std::chrono::milliseconds(400));
                                      return false;
                                  }
                                  reply = b.handle_connection(req);
                                  return true;
                              });
    srv.start();
    mcrs::EngineConfig c = rdma_cfg({"sv0"});
    c.rdma_ready_ack_timeout_ms = 250;
    {
        mcrs::TransferEngine a(c);
        a.register_memory(src.data(), src.size(), "cpu:0", true);
        int32_t seg = a.open_segment(name, false);
        auto t0 = std::chrono::steady_clock::now();
        std::string why;
        CHECK_EQ(run_one(a, seg, OPCODE_WRITE, src.data(), bd.addr, 4096, &why), STATUS_FAILED);
        auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        CHECK(ms < 3000);
        CHECK(why.find("ready ACK") != std::string::npos);
        CHECK(why.find("250 ms") != std::string::npos);
        CHECK(acks.load() >= 1);
        a.unregister_memory(src.data());
    }
    srv.stop();
}

TEST(rdma_passive_gid_from_requester_descriptor) {
    svtest::configure("sv0:roce,sv2:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    mcrs::TransferEngine a(rdma_cfg({"sv0"}));  // the requester: publishes sv0's GID
    mcrs::TransferEngine b(rdma_cfg({"sv2"}));
    std::vector<char> src(4096), dst(4096);
    mctest::fill_random(src, 101);
    b.register_memory(dst.data(), dst.size(), "cpu:0", true);
    svtest::Dev d0("sv0"), d2("sv2");
    svtest::Qp q1(d0), q2(d0);
    HandShakeDesc req = make_request(a.segment_name() + "@sv0", b.segment_name() + "@sv2", 0, "",
                                     {q1.qp->qp_num, q2.qp->qp_num});
    req.ready_ack.reset();
    HandShakeDesc rep = call(*b.rdma(), req);
    CHECK(rep.reply_msg.empty());
    REQUIRE_EQ(rep.qp_num.size(), 2u);
    // Our QP against B's first QP: the WRITE only goes through when B's QP
    // routes back to sv0, i.e. B took sv0's GID from A's descriptor.
    const auto &api = svtest::sv().api();
    REQUIRE_EQ(svtest::to_init(api, q1.qp), 0);
    ibv::qp_attr at = svtest::rtr_attr(d0, d2, rep.qp_num[0]);
    REQUIRE_EQ(api.modify_qp(q1.qp, &at, svtest::kRtrMask), 0);
    REQUIRE_EQ(svtest::to_rts(api, q1.qp), 0);
    svtest::Mr mr(d0, src.data(), src.size(), svtest::kAllAccess);
    REQUIRE(mr.mr != nullptr);
    mcrs::SegmentDesc bd = b.local_descriptor();
    REQUIRE_EQ(bd.buffers.size(), 1u);
    REQUIRE_EQ(bd.buffers[0].rkey.size(), 1u);
    REQUIRE_EQ(svtest::post_rdma(q1.qp, ibv::IBV_WR_RDMA_WRITE, src.data(), 4096, mr.mr->lkey,
                                 reinterpret_cast<uint64_t>(dst.data()), bd.buffers[0].rkey[0], 7),
               0);
    ibv::wc wc{};
    REQUIRE(svtest::wait_wc(d0.cq, wc));
    CHECK_EQ(static_cast<int>(wc.status), static_cast<int>(ibv::IBV_WC_SUCCESS));
    CHECK_EQ(std::memcmp(src.data(), dst.data(), 4096), 0);
    // A NIC the requester does not publish, or a requester that cannot be
    // reached: a rejection saying so.
    HandShakeDesc r2 = req;
    r2.local_nic_path = a.segment_name() + "@sv9";
    rep = call(*b.rdma(), r2);
    CHECK(rep.reply_msg.find("publishes no device 'sv9'") != std::string::npos);
    HandShakeDesc r3 = req;
    r3.local_nic_path = "127.0.0.1:1@sv0";
    rep = call(*b.rdma(), r3);
    CHECK(rep.reply_msg.find("could not be fetched") != std::string::npos);
    b.unregister_memory(dst.data());
}
