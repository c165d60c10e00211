// The RDMA transport end to end through softverbs: two engines in one
// process (each on its own stand-in NICs, picked by allow lists), real
// handshakes over the handshake port, READ/WRITE of many sizes verified
// byte by byte, striping proved by the stand-in's counters, filters,
// link-layer agreement, injected faults, the descriptor shape, the
// C API extras and a missing verbs library.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/text.h"
#include "engine_fixture.h"
#include "core/segment_descriptor.h"
#include "engine/transfer_engine.h"
#include "mooncake_ext.h"
#include "rdma_engine_fixture.h"
#include "softverbs_fixture.h"
#include "transfer_engine_c.h"
#include "transport/rdma/nic_filter.h"
#include "transport/rdma/rdma_transport.h"

namespace {

using mcrs::EngineConfig;
using mcrs::TransferEngine;
using rdmatest::EnvGuard;
using rdmatest::make_pair_engines;
using rdmatest::Pair;
using rdmatest::rdma_cfg;
using rdmatest::run_one;
using rdmatest::sv_wrs;

}  // namespace

TEST(rdma_missing_library_is_a_clear_error) {
    EnvGuard g("MC_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1");
    bool threw = false;
    try {
        TransferEngine e(rdma_cfg({}));
    } catch (const mcrs::Error &err) {
        threw = true;
        std::string m = err.what();
        CHECK(m.find("/nonexistent/libibverbs.so.1") != std::string::npos);
        CHECK(m.find("MC_VERBS_LIBRARY") != std::string::npos);
        CHECK(m.find("TCP") != std::string::npos);
    }
    CHECK(threw);
    // The C API: creation fails with a message, no exception escapes.
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.local_server_name = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.protocols = MC_PROTOCOL_RDMA;
    transfer_engine_t e = mc_engine_create(&c);
    CHECK(e == nullptr);
    CHECK(std::string(mc_last_error_message()).find("nonexistent") != std::string::npos);
}

TEST(rdma_write_read_many_sizes_striped) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=0,sv2:roce:numa=0,sv3:roce:numa=0");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard slice("MC_SLICE_SIZE", "65536");
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2", "sv3"});
    REQUIRE(p.a->rdma() != nullptr);
    REQUIRE_EQ(p.a->rdma()->nic_count(), 2u);
    const size_t kBig = 64u << 20;
    std::vector<char> src(kBig), dst(kBig), back(kBig);
    mctest::fill_random(src, 7);
    p.a->register_memory(src.data(), kBig, "cpu:0", true);
    p.a->register_memory(back.data(), kBig, "cpu:0", true);
    p.b->register_memory(dst.data(), kBig, "cpu:0", true);
    p.seg = p.a->open_segment(p.b->segment_name(), false);
    auto d = p.a->segment_desc(p.seg);
    REQUIRE(d != nullptr);
    CHECK_EQ(d->protocol, std::string("rdma"));
    REQUIRE_EQ(d->devices.size(), 2u);
    CHECK_EQ(d->devices[0].link_layer, std::string("RoCE"));
    svtest::sv().reset_counters();
    uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    const uint64_t sizes[] = {1, 7, 4096, 65535, 65536, 65537, 1u << 20, (3u << 20) + 5, kBig};
    uint64_t off = 0;
    for (uint64_t n : sizes) {
        uint64_t o = n == kBig ? 0 : off;
        std::string why;
        CHECK_EQ(run_one(*p.a, p.seg, OPCODE_WRITE, src.data() + o, remote + o, n, &why), STATUS_COMPLETED);
        CHECK_EQ(std::memcmp(src.data() + o, dst.data() + o, n), 0);
        CHECK_EQ(run_one(*p.a, p.seg, OPCODE_READ, back.data() + o, remote + o, n, &why), STATUS_COMPLETED);
        CHECK_EQ(std::memcmp(back.data() + o, dst.data() + o, n), 0);
        if (n != kBig) off += n + 3;
    }
    // Both local NICs carried slices (striping), counted by the stand-in and by us.
    CHECK(sv_wrs("sv0") > 100);
    CHECK(sv_wrs("sv1") > 100);
    auto cs = p.a->rdma()->counters();
    REQUIRE_EQ(cs.size(), 2u);
    CHECK(cs[0].wrs > 0 && cs[1].wrs > 0);
    CHECK(cs[0].bytes + cs[1].bytes >= 2 * kBig);
    // A remote range outside the peer's buffers never reaches the NIC.
    std::string why;
    CHECK_EQ(run_one(*p.a, p.seg, OPCODE_WRITE, src.data(), remote + kBig - 10, 20, &why), STATUS_FAILED);
    CHECK(why.find("not inside a buffer") != std::string::npos);
    // The engine keeps serving after that.
    CHECK_EQ(run_one(*p.a, p.seg, OPCODE_WRITE, src.data(), remote, 100, &why), STATUS_COMPLETED);
    p.b->unregister_memory(dst.data());
    p.a->unregister_memory(src.data());
    p.a->unregister_memory(back.data());
}

TEST(rdma_descriptor_upstream_shape_round_trip) {
    svtest::configure("sv0:ib,sv1:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    TransferEngine e(rdma_cfg({}, mcrs::kProtoRdma | mcrs::kProtoTcp));
    std::vector<char> buf(4096);
    e.register_memory(buf.data(), buf.size(), "cpu:0", true);
    mcrs::SegmentDesc d = e.local_descriptor();
    CHECK_EQ(d.protocol, std::string("rdma"));
    CHECK(d.tcp_data_port != 0);  // TCP keys kept for TCP-only peers
    REQUIRE_EQ(d.devices.size(), 2u);
    REQUIRE_EQ(d.buffers.size(), 1u);
    CHECK_EQ(d.buffers[0].lkey.size(), 2u);
    CHECK_EQ(d.buffers[0].rkey.size(), 2u);
    mcrs::Json j = mcrs::encode_segment_desc(d);
    CHECK(j.find("priority_matrix") != nullptr && j.find("priority_matrix")->is_object());
    CHECK(j.find("devices") != nullptr);
    CHECK(j.find("rdma_server_name") != nullptr);
    mcrs::SegmentDesc back = mcrs::decode_segment_desc(j);
    REQUIRE_EQ(back.devices.size(), 2u);
    CHECK_EQ(back.devices[0].gid, d.devices[0].gid);
    CHECK_EQ(back.devices[0].link_layer, d.devices[0].link_layer);
    CHECK(back.buffers[0].rkey == d.buffers[0].rkey);
    // A descriptor shaped as upstream writes it decodes.
    const char *upstream = R"({"name":"10.0.0.2:12345","protocol":"rdma","tcp_data_port":0,
      "devices":[{"name":"mlx5_0","lid":0,"gid":"fe80:0000:0000:0000:0000:0000:0000:0001"}],
      "buffers":[{"name":"cpu:0","addr":4096,"length":1024,"lkey":[5],"rkey":[6]}],
      "priority_matrix":{"cpu:0":[["mlx5_0"],[]]},"rdma_server_name":"","timestamp":"0"})";
    mcrs::SegmentDesc u = mcrs::decode_segment_desc(mcrs::Json::parse(upstream));
    CHECK_EQ(u.protocol, std::string("rdma"));
    REQUIRE_EQ(u.devices.size(), 1u);
    CHECK_EQ(u.buffers[0].rkey.size(), 1u);
    // Topology and counters through the C API would need a handle; the
    // transport's JSON is what mc_engine_rdma_topology returns.
    mcrs::Json t = e.rdma()->topology_json();
    CHECK(t.find("devices") != nullptr && t.find("priority_matrix") != nullptr);
    e.unregister_memory(buf.data());
}

TEST(rdma_filters_leave_nothing_clear_error) {
    svtest::configure("sv0:roce,sv1:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    {
        bool threw = false;
        try {
            TransferEngine e(rdma_cfg({"mlx5_9"}));
        } catch (const mcrs::Error &err) {
            threw = true;
            std::string m = err.what();
            CHECK(m.find("sv0") != std::string::npos);
            CHECK(m.find("mlx5_9") != std::string::npos);
            CHECK(m.find("allow-list") != std::string::npos);
        }
        CHECK(threw);
    }
    {
        EnvGuard f("MC_TE_FILTERS", "sv1");
        TransferEngine e(rdma_cfg({}));
        REQUIRE_EQ(e.rdma()->nic_count(), 1u);
        CHECK_EQ(e.rdma()->counters()[0].name, std::string("sv1"));
    }
    {
        EngineConfig c = rdma_cfg({});
        c.device_deny_list = {"sv0"};
        TransferEngine e(c);
        REQUIRE_EQ(e.rdma()->nic_count(), 1u);
        CHECK_EQ(e.rdma()->counters()[0].name, std::string("sv1"));
    }
}

TEST(rdma_link_layer_agreement) {
    svtest::configure("sv0:ib,sv1:roce,sv2:ib,sv3:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    std::vector<char> a(1 << 20), b(1 << 20);
    mctest::fill_random(a, 3);
    {
        // IB-only to RoCE-only: FAILED, with a reason.
        Pair p = make_pair_engines({"sv0"}, {"sv3"});
        p.a->register_memory(a.data(), a.size(), "cpu:0", true);
        p.b->register_memory(b.data(), b.size(), "cpu:0", true);
        int32_t seg = p.a->open_segment(p.b->segment_name(), false);
        std::string why;
        CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), reinterpret_cast<uint64_t>(b.data()), 4096, &why),
                 STATUS_FAILED);
        CHECK(why.find("IB") != std::string::npos || why.find("link") != std::string::npos);
        p.a->unregister_memory(a.data());
        p.b->unregister_memory(b.data());
    }
    {
        // Mixed local (IB + RoCE) to RoCE-only peer: RoCE chosen, data moves.
        svtest::sv().reset_counters();
        Pair p = make_pair_engines({"sv0", "sv1"}, {"sv3"});
        p.a->register_memory(a.data(), a.size(), "cpu:0", true);
        p.b->register_memory(b.data(), b.size(), "cpu:0", true);
        int32_t seg = p.a->open_segment(p.b->segment_name(), false);
        CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), reinterpret_cast<uint64_t>(b.data()), a.size()),
                 STATUS_COMPLETED);
        CHECK_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
        CHECK_EQ(sv_wrs("sv0"), 0u);
        CHECK(sv_wrs("sv1") > 0);
        p.a->unregister_memory(a.data());
        p.b->unregister_memory(b.data());
    }
}

TEST(rdma_faults_retry_or_fail_cleanly) {
    svtest::configure("sv0:roce,sv1:roce,sv2:roce,sv3:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard retry("MC_RETRY_CNT", "3");
    std::vector<char> a(1 << 20), b(1 << 20);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2", "sv3"});
    p.a->register_memory(a.data(), a.size(), "cpu:0", true);
    p.b->register_memory(b.data(), b.size(), "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(b.data());
    // Remote access error on one WR of sv0: retried on another NIC.
    mctest::fill_random(a, 11);
    REQUIRE_EQ(svtest::sv().inject_wc_error("sv0", nullptr, 1, mcrs::ibv::IBV_WC_REM_ACCESS_ERR), 0);
    std::string why;
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, a.size(), &why), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
    auto cs = p.a->rdma()->counters();
    CHECK(cs[0].errors + cs[1].errors >= 1);
    CHECK(cs[0].retries + cs[1].retries >= 1);
    // Port down on sv0: the NIC is disabled, the other carries the work.
    REQUIRE_EQ(svtest::sv().set_port_state("sv0", 0), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    mctest::fill_random(a, 12);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, a.size(), &why), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
    CHECK(!p.a->rdma()->counters()[0].usable);
    svtest::sv().reset_faults();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // Errors on every path, more than MC_RETRY_CNT: FAILED naming NIC and status.
    REQUIRE_EQ(svtest::sv().inject_wc_error("sv0", nullptr, 100, mcrs::ibv::IBV_WC_REM_ACCESS_ERR), 0);
    REQUIRE_EQ(svtest::sv().inject_wc_error("sv1", nullptr, 100, mcrs::ibv::IBV_WC_REM_ACCESS_ERR), 0);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_READ, a.data(), remote, 4096, &why), STATUS_FAILED);
    CHECK(why.find("IBV_WC_REM_ACCESS_ERR") != std::string::npos);
    CHECK(why.find("sv") != std::string::npos);
    svtest::sv().reset_faults();
    // And the engine still works afterwards.
    CHECK_EQ(run_one(*p.a, seg, OPCODE_READ, a.data(), remote, a.size(), &why), STATUS_COMPLETED);
    p.a->unregister_memory(a.data());
    p.b->unregister_memory(b.data());
}

TEST(rdma_registration_efault_message) {
    svtest::configure("sv0:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    TransferEngine e(rdma_cfg({}));
    std::vector<char> buf(8192);
    REQUIRE_EQ(svtest::sv().add_efault_range(reinterpret_cast<uint64_t>(buf.data()), 1), 0);
    bool threw = false;
    try {
        e.register_memory(buf.data(), buf.size(), "cpu:0", true);
    } catch (const mcrs::Error &err) {
        threw = true;
        CHECK(std::string(err.what()).find("sv0") != std::string::npos);
    }
    CHECK(threw);
    // Not left half-registered: the registry does not hold it.
    CHECK(e.location_of(buf.data()).empty());
    svtest::sv().clear_efault_ranges();
    e.register_memory(buf.data(), buf.size(), "cpu:0", true);
    e.unregister_memory(buf.data());
}

TEST(rdma_backpressure_small_queues) {
    // 2048 slices through send queues of 16 WRs: the submitter waits for
    // free slots instead of overrunning the QPs or the CQ.
    svtest::configure("sv0:roce,sv1:roce,sv2:roce,sv3:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard slice("MC_SLICE_SIZE", "4096");
    EnvGuard wr("MC_MAX_WR", "16");
    EnvGuard cqe("MC_MAX_CQE_PER_CTX", "64");
    std::vector<char> a(8u << 20), b(8u << 20), c(8u << 20);
    mctest::fill_random(a, 21);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2", "sv3"});
    p.a->register_memory(a.data(), a.size(), "cpu:0", true);
    p.a->register_memory(c.data(), c.size(), "cpu:0", true);
    p.b->register_memory(b.data(), b.size(), "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(b.data());
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, a.size()), STATUS_COMPLETED);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_READ, c.data(), remote, c.size()), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), c.data(), a.size()), 0);
    p.a->unregister_memory(a.data());
    p.a->unregister_memory(c.data());
    p.b->unregister_memory(b.data());
}

TEST(rdma_c_api_install_topology_counters) {
    svtest::configure("sv0:ib:numa=0,sv1:roce:numa=1");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    transfer_engine_t e = mctest::make_engine();
    REQUIRE(e != nullptr);
    char buf[4096];
    size_t need = 0;
    CHECK(mc_engine_rdma_topology(e, buf, sizeof buf, &need) != 0);  // not installed yet
    CHECK(installTransport(e, "rdma", nullptr) != nullptr);
    CHECK(installTransport(e, "rdma", nullptr) != nullptr);  // idempotent
    REQUIRE_EQ(mc_engine_rdma_topology(e, buf, sizeof buf, &need), 0);
    std::string topo(buf);
    CHECK(topo.find("\"sv0\"") != std::string::npos);
    CHECK(topo.find("\"IB\"") != std::string::npos);
    CHECK(topo.find("\"RoCE\"") != std::string::npos);
    CHECK(topo.find("priority_matrix") != std::string::npos);
    CHECK(topo.find("cpu:1") != std::string::npos);
    CHECK(mc_engine_rdma_topology(e, buf, 4, &need) != 0);  // too small, no exception
    REQUIRE_EQ(mc_engine_rdma_counters(e, buf, sizeof buf, &need), 0);
    CHECK(std::string(buf).find("work_requests") != std::string::npos);
    CHECK(mc_engine_rdma_counters(nullptr, buf, sizeof buf, &need) != 0);
    destroyTransferEngine(e);
}

// Real hardware (scripts/rdma-hw-lane.sh): opt-in with
// MOONCAKE_RDMA_HW_TESTS=1, then it fails for real when no usable NIC is
// found. Two engines on the machine's own NICs (libibverbs.so.1, or
// MC_VERBS_LIBRARY when the lane sets it), 64 MiB WRITE + READ verified.
TEST(rdma_hw_loopback) {
    const char *on = std::getenv("MOONCAKE_RDMA_HW_TESTS");
    if (!on || std::string(on) != "1") return;
    const size_t n = 64u << 20;
    std::vector<char> a(n), b(n), c(n);
    mctest::fill_random(a, 99);
    const char *allow = std::getenv("MOONCAKE_RDMA_HW_DEVICES");  // optional, comma-separated
    std::vector<std::string> list = allow ? mcrs::split_list(allow) : std::vector<std::string>{};
    TransferEngine x(rdma_cfg(list));
    TransferEngine y(rdma_cfg(list));
    x.register_memory(a.data(), n, "cpu:0", true);
    x.register_memory(c.data(), n, "cpu:0", true);
    y.register_memory(b.data(), n, "cpu:0", true);
    int32_t seg = x.open_segment(y.segment_name(), false);
    std::string why;
    uint64_t remote = reinterpret_cast<uint64_t>(b.data());
    REQUIRE_EQ(run_one(x, seg, OPCODE_WRITE, a.data(), remote, n, &why), STATUS_COMPLETED);
    REQUIRE_EQ(std::memcmp(a.data(), b.data(), n), 0);
    REQUIRE_EQ(run_one(x, seg, OPCODE_READ, c.data(), remote, n, &why), STATUS_COMPLETED);
    REQUIRE_EQ(std::memcmp(a.data(), c.data(), n), 0);
    std::fprintf(stderr, "rdma_hw_loopback: %s\n", x.rdma()->topology_json().dump().c_str());
    x.unregister_memory(a.data());
    x.unregister_memory(c.data());
    y.unregister_memory(b.data());
}
