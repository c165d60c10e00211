// Local NIC choice by buffer location (docs/wire-protocol.md, RDMA priority
// matrix): the pure plan/pick functions, then engines over softverbs whose NICs sit on
// different NUMA nodes, a custom matrix (MC_CUSTOM_TOPO_JSON and
// installTransport's args[0]) and the fallback when a preferred NIC is down.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine_fixture.h"
#include "rdma_engine_fixture.h"
#include "rdma_tmp_dir.h"
#include "transfer_engine_c.h"
#include "transport/rdma/nic_choice.h"
#include "transport/rdma/rdma_transport.h"

using namespace mcrs::rdma;
using rdmatest::EnvGuard;
using rdmatest::make_pair_engines;
using rdmatest::Pair;
using rdmatest::rdma_cfg;
using rdmatest::run_one;
using rdmatest::sv_served;
using rdmatest::sv_wrs;

namespace {

Topology two_node_topo() {
    return Topology::from_json_text(R"({"cpu:0":[["n0"],["n1","n2"]],"cpu:1":[["n1","n2"],["n0"]]})",
                                    mcrs::kErrInvalidArgument, "test");
}

size_t idx(const Topology &t, const char *n) { return static_cast<size_t>(t.hca_index(n)); }

}  // namespace

TEST(rdma_nic_choice_plan_prefers_location) {
    Topology t = two_node_topo();
    std::vector<size_t> all{idx(t, "n0"), idx(t, "n1"), idx(t, "n2")};
    std::sort(all.begin(), all.end());
    LocalNicPlan p = plan_local_nics(t, "cpu:0", all);
    REQUIRE_EQ(p.stripe.size(), 1u);
    CHECK_EQ(p.stripe[0], idx(t, "n0"));
    CHECK_EQ(p.fallback.size(), 2u);
    p = plan_local_nics(t, "cpu:1", all);
    CHECK_EQ(p.stripe.size(), 2u);
    CHECK_EQ(p.fallback.size(), 1u);
    // Preferred NIC not eligible (down / filtered): the available ones.
    std::vector<size_t> no_n0{idx(t, "n1"), idx(t, "n2")};
    p = plan_local_nics(t, "cpu:0", no_n0);
    CHECK_EQ(p.stripe.size(), 2u);
    CHECK(p.fallback.empty());
    // Unknown location: the implicit wildcard (every NIC preferred).
    p = plan_local_nics(t, "cuda:3", all);
    CHECK_EQ(p.stripe.size(), 3u);
    // Nothing of the entry eligible: every eligible NIC.
    Topology one = Topology::from_json_text(R"({"cpu:0":[["n0"],[]],"cpu:1":[["n1"],[]]})",
                                            mcrs::kErrInvalidArgument, "test");
    p = plan_local_nics(one, "cpu:0", {idx(one, "n1")});
    REQUIRE_EQ(p.stripe.size(), 1u);
    CHECK_EQ(p.stripe[0], idx(one, "n1"));
}

TEST(rdma_nic_choice_pick_rail_skips_paused_and_down) {
    LocalNicPlan p;
    p.stripe = {0, 1};
    p.fallback = {2};
    NicPlan two;
    two.stripe = {0, 1};
    NicPlan one;
    one.stripe = {0};
    auto up = [](size_t) { return true; };
    auto none = [](size_t, size_t) { return false; };
    RailPick r = pick_rail(p, 1, two, 1, up, none);
    REQUIRE(r.found);
    CHECK_EQ(local_at(p, r.local_pos), 1u);
    CHECK_EQ(r.peer_pos, 1u);
    // Stripe NICs down: the fallback.
    r = pick_rail(p, 0, two, 0, [](size_t n) { return n == 2; }, none);
    REQUIRE(r.found);
    CHECK_EQ(local_at(p, r.local_pos), 2u);
    // Rail (0, peer 0) paused: peer 1 on the same NIC.
    r = pick_rail(p, 0, two, 0, up, [](size_t l, size_t pn) { return l == 0 && pn == 0; });
    REQUIRE(r.found);
    CHECK_EQ(local_at(p, r.local_pos), 0u);
    CHECK_EQ(r.peer_pos, 1u);
    // Everything paused: still a rail (a paused rail beats none).
    r = pick_rail(p, 0, two, 0, up, [](size_t, size_t) { return true; });
    CHECK(r.found);
    // Avoided local NIC skipped while another exists.
    r = pick_rail(p, 0, one, 0, up, none, 0);
    REQUIRE(r.found);
    CHECK_EQ(local_at(p, r.local_pos), 1u);
    // Nothing usable.
    r = pick_rail(p, 0, one, 0, [](size_t) { return false; }, none);
    CHECK(!r.found);
    // Peer side: the stripe (rotated) first, the fallback only when every
    // stripe rail is paused; `paused` sees the peer NIC, not its position.
    NicPlan peers;
    peers.stripe = {5};
    peers.fallback = {3, 4};
    r = pick_rail(p, 0, peers, 7, up, none);
    REQUIRE(r.found);
    CHECK_EQ(nic_at(peers, r.peer_pos), 5u);
    r = pick_rail(p, 0, peers, 0, up, [](size_t, size_t pn) { return pn == 5; });
    REQUIRE(r.found);
    CHECK_EQ(local_at(p, r.local_pos), 0u);
    CHECK_EQ(nic_at(peers, r.peer_pos), 3u);
    r = pick_rail(p, 0, peers, 0, up, [](size_t, size_t pn) { return pn != 4; });
    REQUIRE(r.found);
    CHECK_EQ(nic_at(peers, r.peer_pos), 4u);
    // Empty peer plan: nothing.
    CHECK(!pick_rail(p, 0, NicPlan{}, 0, up, none).found);
}

TEST(rdma_nic_choice_peer_plan_follows_published_matrix) {
    // devices[] order differs from the matrix order on purpose: the plan
    // maps by name.
    std::vector<std::string> devs{"p1", "p0", "p2"};
    mcrs::Json m = mcrs::Json::parse(R"({"cpu:0":[["p0"],["p1"]],"cpu:1":[["p1"],["p0","p2"]]})");
    PeerTopology t = PeerTopology::from_descriptor(m, devs);
    std::vector<size_t> all{0, 1, 2};
    NicPlan p = plan_peer_nics(t, "cpu:0", all);
    CHECK(p.stripe == std::vector<size_t>{1});
    CHECK(p.fallback == (std::vector<size_t>{0, 2}));  // available first, then the rest
    p = plan_peer_nics(t, "cpu:1", all);
    CHECK(p.stripe == std::vector<size_t>{0});
    CHECK(p.fallback == (std::vector<size_t>{1, 2}));
    // Preferred NIC not link-layer compatible: the available ones.
    p = plan_peer_nics(t, "cpu:1", {1, 2});
    CHECK(p.stripe == (std::vector<size_t>{1, 2}));
    CHECK(p.fallback.empty());
    // Nothing of the entry eligible: every eligible NIC.
    p = plan_peer_nics(t, "cpu:0", {2});
    CHECK(p.stripe == std::vector<size_t>{2});
    // Unknown location, no "*": every device preferred.
    p = plan_peer_nics(t, "cuda:0", all);
    CHECK_EQ(p.stripe.size(), 3u);
    CHECK(p.fallback.empty());
    // No matrix published: every device preferred.
    PeerTopology none = PeerTopology::from_descriptor(mcrs::Json(), devs);
    p = plan_peer_nics(none, "cpu:0", all);
    CHECK(p.stripe == (std::vector<size_t>{0, 1, 2}));
    // A "*" entry catches unknown locations.
    PeerTopology star =
        PeerTopology::from_descriptor(mcrs::Json::parse(R"({"*":[["p2"],[]]})"), devs);
    p = plan_peer_nics(star, "cuda:3", all);
    CHECK(p.stripe == std::vector<size_t>{2});
    CHECK(p.fallback == (std::vector<size_t>{0, 1}));
    CHECK_EQ(t.index_of("p0"), 1);
    CHECK_EQ(t.index_of("zz"), -1);
}

TEST(rdma_local_nics_follow_buffer_numa) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=1,sv2:roce:numa=0,sv3:roce:numa=1");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", nullptr);
    const size_t n = 1u << 20;
    std::vector<char> a0(n), a1(n), dst(n);
    mctest::fill_random(a0, 31);
    mctest::fill_random(a1, 32);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2", "sv3"});
    p.a->register_memory(a0.data(), n, "cpu:0", true);
    p.a->register_memory(a1.data(), n, "cpu:1", true);
    p.b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    TopologyEntry e0 = p.a->rdma()->topology().entry_for("cpu:0");
    REQUIRE_EQ(e0.preferred.size(), 1u);
    CHECK_EQ(e0.preferred[0], std::string("sv0"));

    // cpu:0 memory goes out on sv0 only, cpu:1 memory on sv1 only.
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a0.data(), remote, n), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a0.data(), dst.data(), n), 0);
    CHECK_EQ(sv_wrs("sv0"), 16u);
    CHECK_EQ(sv_wrs("sv1"), 0u);
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_READ, a1.data(), remote, n), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a1.data(), dst.data(), n), 0);
    CHECK_EQ(sv_wrs("sv0"), 0u);
    CHECK_EQ(sv_wrs("sv1"), 16u);
    // The engine's per-NIC counters agree.
    auto cs = p.a->rdma()->counters();
    REQUIRE_EQ(cs.size(), 2u);
    CHECK(cs[0].name == "sv0" || cs[1].name == "sv0");

    // Preferred NIC down: cpu:0 memory falls back to sv1.
    REQUIRE_EQ(svtest::sv().set_port_state("sv0", 0), 0);
    for (int i = 0; i < 100 && p.a->rdma()->counters()[0].usable && p.a->rdma()->counters()[1].usable; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    svtest::sv().reset_counters();
    mctest::fill_random(a0, 33);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a0.data(), remote, n), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a0.data(), dst.data(), n), 0);
    CHECK_EQ(sv_wrs("sv0"), 0u);
    CHECK_EQ(sv_wrs("sv1"), 16u);
    svtest::sv().reset_faults();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    p.a->unregister_memory(a0.data());
    p.a->unregister_memory(a1.data());
    p.b->unregister_memory(dst.data());
}

TEST(rdma_local_nics_from_custom_topology_file) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=1,sv2:roce:numa=0,sv3:roce:numa=1");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    const size_t n = 1u << 20;
    std::vector<char> a(n), dst(n);
    mctest::fill_random(a, 41);
    // The peer first: the file names our NICs only.
    auto b = std::make_unique<mcrs::TransferEngine>(rdma_cfg({"sv2", "sv3"}));
    mctest::TmpDir tmp;
    tmp.write("topo.json", R"({"cpu:0":[["sv1"],["sv0"]],"cpu:1":[["sv0"],["sv1"]]})");
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", tmp.at("topo.json").c_str());
    auto x = std::make_unique<mcrs::TransferEngine>(rdma_cfg({"sv0", "sv1"}));
    x->register_memory(a.data(), n, "cpu:0", true);
    b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg = x->open_segment(b->segment_name(), false);
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*x, seg, OPCODE_WRITE, a.data(), reinterpret_cast<uint64_t>(dst.data()), n),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
    CHECK_EQ(sv_wrs("sv0"), 0u);
    CHECK_EQ(sv_wrs("sv1"), 16u);
    x->unregister_memory(a.data());
    b->unregister_memory(dst.data());
}

TEST(rdma_install_transport_with_topology_arg) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=1,sv2:roce:numa=0,sv3:roce:numa=1");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", nullptr);
    const char *matrix = R"({"cpu:0":[["sv1"],["sv0"]],"cpu:1":[["sv0"],["sv1"]]})";
    {
        // C API: args[0] is honoured, shown by the topology JSON.
        transfer_engine_t e = mctest::make_engine();
        REQUIRE(e != nullptr);
        void *args[2] = {const_cast<char *>(matrix), nullptr};
        REQUIRE(installTransport(e, "rdma", args) != nullptr);
        char buf[8192];
        size_t need = 0;
        REQUIRE_EQ(mc_engine_rdma_topology(e, buf, sizeof buf, &need), 0);
        mcrs::Json t = mcrs::Json::parse(buf);
        const mcrs::Json *pm = t.find("priority_matrix");
        REQUIRE(pm != nullptr);
        CHECK_EQ(pm->dump(), mcrs::Json::parse(matrix).dump());
        CHECK(installTransport(e, "rdma", args) != nullptr);     // same matrix: idempotent
        CHECK(installTransport(e, "rdma", nullptr) != nullptr);  // none: idempotent
        void *other[2] = {const_cast<char *>(R"({"cpu:0":[["sv0"],[]]})"), nullptr};
        CHECK(installTransport(e, "rdma", other) == nullptr);  // a different one: refused
        CHECK(std::string(mc_last_error_message()).find("already installed") != std::string::npos);
        destroyTransferEngine(e);
    }
    {
        // Malformed or naming unknown NICs: a clear error, no exception.
        transfer_engine_t e = mctest::make_engine();
        REQUIRE(e != nullptr);
        void *bad[2] = {const_cast<char *>(R"({"cpu:0":[["sv0"]]})"), nullptr};
        CHECK(installTransport(e, "rdma", bad) == nullptr);
        CHECK(std::string(mc_last_error_message()).find("cpu:0") != std::string::npos);
        void *unknown[2] = {const_cast<char *>(R"({"cpu:0":[["mlx5_7"],[]]})"), nullptr};
        CHECK(installTransport(e, "rdma", unknown) == nullptr);
        CHECK(std::string(mc_last_error_message()).find("mlx5_7") != std::string::npos);
        destroyTransferEngine(e);
    }
    {
        // The matrix steers the data path: cpu:0 memory leaves on sv1.
        const size_t n = 1u << 20;
        std::vector<char> a(n), dst(n);
        mctest::fill_random(a, 51);
        auto b = std::make_unique<mcrs::TransferEngine>(rdma_cfg({"sv2", "sv3"}));
        auto x = std::make_unique<mcrs::TransferEngine>(rdma_cfg({}, mcrs::kProtoTcp));
        x->install_transport("rdma", matrix);
        REQUIRE_EQ(x->rdma()->nic_count(), 2u);
        x->register_memory(a.data(), n, "cpu:0", true);
        b->register_memory(dst.data(), n, "cpu:0", true);
        int32_t seg = x->open_segment(b->segment_name(), false);
        svtest::sv().reset_counters();
        CHECK_EQ(run_one(*x, seg, OPCODE_WRITE, a.data(), reinterpret_cast<uint64_t>(dst.data()), n),
                 STATUS_COMPLETED);
        CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
        CHECK_EQ(sv_wrs("sv0"), 0u);
        CHECK_EQ(sv_wrs("sv1"), 16u);
        x->unregister_memory(a.data());
        b->unregister_memory(dst.data());
    }
}

// The peer NIC follows the peer's published matrix for the TARGET buffer's
// location (docs/wire-protocol.md, RDMA priority matrix); a paused rail to
// the preferred peer NIC moves the
// slices to the peer's other NIC.
TEST(rdma_peer_nics_follow_target_buffer_location) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=1,sv2:roce:numa=0,sv3:roce:numa=1");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", nullptr);
    EnvGuard pause("MC_RDMA_RAIL_PAUSE_SECONDS", "30");
    const size_t n = 1u << 20;
    std::vector<char> src(n), d0(n), d1(n);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2", "sv3"});
    p.a->register_memory(src.data(), n, "cpu:0", true);
    p.b->register_memory(d0.data(), n, "cpu:0", true);
    p.b->register_memory(d1.data(), n, "cpu:1", true);
    // The peer publishes cpu:0 -> sv2, cpu:1 -> sv3 (discovered from NUMA).
    mcrs::SegmentDesc bd = p.b->local_descriptor();
    PeerTopology pt = PeerTopology::from_descriptor(bd.priority_matrix, {"sv2", "sv3"});
    REQUIRE(pt.entry_for("cpu:1").preferred == std::vector<std::string>{"sv3"});
    REQUIRE(pt.entry_for("cpu:0").preferred == std::vector<std::string>{"sv2"});
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);

    // cpu:1 target: served by sv3 only; cpu:0 target: by sv2 only.
    mctest::fill_random(src, 51);
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, src.data(), reinterpret_cast<uint64_t>(d1.data()), n),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(src.data(), d1.data(), n), 0);
    CHECK_EQ(sv_served("sv3"), 16u);
    CHECK_EQ(sv_served("sv2"), 0u);
    CHECK_EQ(sv_wrs("sv0"), 16u);  // local side still follows the local buffer
    mctest::fill_random(src, 52);
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, src.data(), reinterpret_cast<uint64_t>(d0.data()), n),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(src.data(), d0.data(), n), 0);
    CHECK_EQ(sv_served("sv2"), 16u);
    CHECK_EQ(sv_served("sv3"), 0u);
    // READs pick the peer NIC the same way.
    svtest::sv().reset_counters();
    std::vector<char> back(n);
    p.a->register_memory(back.data(), n, "cpu:0", true);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_READ, back.data(), reinterpret_cast<uint64_t>(d1.data()), n),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(back.data(), d1.data(), n), 0);
    CHECK_EQ(sv_served("sv3"), 16u);
    CHECK_EQ(sv_served("sv2"), 0u);

    // A remote fault on sv0 -> sv3 pauses that rail; the cpu:1 slices move
    // to the peer's sv2 and the data still arrives.
    std::string rail3 = p.b->segment_name() + "@sv3";
    REQUIRE_EQ(svtest::sv().inject_wc_error("sv0", "sv3", 1, mcrs::ibv::IBV_WC_RETRY_EXC_ERR), 0);
    mctest::fill_random(src, 53);
    svtest::sv().reset_counters();
    std::string why;
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, src.data(), reinterpret_cast<uint64_t>(d1.data()), n, &why),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(src.data(), d1.data(), n), 0);
    CHECK(p.a->rdma()->rail_paused("sv0", rail3));
    CHECK(sv_served("sv2") > 0);
    // While paused, every cpu:1 slice lands on sv2.
    mctest::fill_random(src, 54);
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, src.data(), reinterpret_cast<uint64_t>(d1.data()), n),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(src.data(), d1.data(), n), 0);
    CHECK_EQ(sv_served("sv3"), 0u);
    CHECK_EQ(sv_served("sv2"), 16u);

    svtest::sv().reset_faults();
    p.a->unregister_memory(src.data());
    p.a->unregister_memory(back.data());
    p.b->unregister_memory(d0.data());
    p.b->unregister_memory(d1.data());
}
