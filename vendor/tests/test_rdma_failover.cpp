// Rail pauses (docs/wire-protocol.md, RDMA slicing and failure handling) and
// slice timeouts through softverbs: a remote fault pauses the (local NIC,
// peer NIC) rail and traffic moves to the other rails until the cooldown
// ends; a local fault does not blame
// the rail; a lost or stalled completion ends in a retry or a FAILED
// status naming the NIC and the timeout.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine_fixture.h"
#include "rdma_engine_fixture.h"
#include "transport/rdma/rdma_transport.h"

using rdmatest::EnvGuard;
using rdmatest::make_pair_engines;
using rdmatest::Pair;
using rdmatest::run_one;
using rdmatest::sv_served;
using rdmatest::sv_wrs;
namespace ibv = mcrs::ibv;

TEST(rdma_rail_paused_after_remote_fault_then_resumed) {
    svtest::configure("sv0:roce,sv1:roce,sv2:roce,sv3:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard pause("MC_RDMA_RAIL_PAUSE_SECONDS", "1");
    const size_t n = 1u << 20;
    std::vector<char> a(n), dst(n);
    Pair p = make_pair_engines({"sv0"}, {"sv2", "sv3"});
    p.a->register_memory(a.data(), n, "cpu:0", true);
    p.b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    std::string rail2 = p.b->segment_name() + "@sv2", rail3 = p.b->segment_name() + "@sv3";
    // Warm up both rails, then one remote fault on sv0 -> sv2.
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n), STATUS_COMPLETED);
    REQUIRE_EQ(svtest::sv().inject_wc_error("sv0", "sv2", 1, ibv::IBV_WC_RETRY_EXC_ERR), 0);
    mctest::fill_random(a, 61);
    std::string why;
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n, &why), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
    // Another rail existed, so one error paused it.
    CHECK(p.a->rdma()->rail_paused("sv0", rail2));
    CHECK(!p.a->rdma()->rail_paused("sv0", rail3));
    // While paused, everything goes over sv0 -> sv3.
    svtest::sv().reset_counters();
    mctest::fill_random(a, 62);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
    CHECK_EQ(sv_served("sv2"), 0u);
    CHECK_EQ(sv_served("sv3"), 16u);
    // After the cooldown both rails carry slices again.
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    CHECK(!p.a->rdma()->rail_paused("sv0", rail2));
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n), STATUS_COMPLETED);
    CHECK(sv_served("sv2") > 0);
    CHECK(sv_served("sv3") > 0);
    p.a->unregister_memory(a.data());
    p.b->unregister_memory(dst.data());
}

TEST(rdma_local_fault_moves_nic_without_pausing_rail) {
    svtest::configure("sv0:roce,sv1:roce,sv2:roce,sv3:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    const size_t n = 1u << 20;
    std::vector<char> a(n), dst(n);
    mctest::fill_random(a, 71);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2"});
    p.a->register_memory(a.data(), n, "cpu:0", true);
    p.b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    REQUIRE_EQ(svtest::sv().inject_wc_error("sv0", nullptr, 1, ibv::IBV_WC_LOC_LEN_ERR), 0);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
    // (WRs flushed behind the failed one on its QP count too.)
    auto cs = p.a->rdma()->counters();
    CHECK(cs[0].errors + cs[1].errors >= 1u);
    CHECK(cs[0].retries + cs[1].retries >= 1u);
    // Our NIC's fault, not the peer's: the rail stays open.
    CHECK(!p.a->rdma()->rail_paused("sv0", p.b->segment_name() + "@sv2"));
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n), STATUS_COMPLETED);
    CHECK(sv_wrs("sv0") > 0);
    CHECK(sv_wrs("sv1") > 0);
    p.a->unregister_memory(a.data());
    p.b->unregister_memory(dst.data());
}

TEST(rdma_slice_timeout_lost_completion_is_retried) {
    svtest::configure("sv0:roce,sv1:roce,sv2:roce,sv3:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard to("MC_SLICE_TIMEOUT", "1");
    const size_t n = 256u << 10;
    std::vector<char> a(n), dst(n);
    mctest::fill_random(a, 81);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2", "sv3"});
    p.a->register_memory(a.data(), n, "cpu:0", true);
    p.b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    REQUIRE_EQ(svtest::sv().drop_completions("sv0", 1), 0);
    auto t0 = std::chrono::steady_clock::now();
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), reinterpret_cast<uint64_t>(dst.data()), n),
             STATUS_COMPLETED);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    CHECK(ms >= 900);  // waited for the timeout, then retried
    CHECK(ms < 5000);
    CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
    auto cs = p.a->rdma()->counters();
    CHECK(cs[0].retries + cs[1].retries >= 1);
    p.a->unregister_memory(a.data());
    p.b->unregister_memory(dst.data());
}

TEST(rdma_slice_timeout_fails_naming_nic_and_limit) {
    svtest::configure("sv0:roce,sv2:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard to("MC_SLICE_TIMEOUT", "1");
    EnvGuard retry("MC_RETRY_CNT", "2");
    const size_t n = 64u << 10;
    std::vector<char> a(n), dst(n);
    Pair p = make_pair_engines({"sv0"}, {"sv2"});
    p.a->register_memory(a.data(), n, "cpu:0", true);
    p.b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg = p.a->open_segment(p.b->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    // Every completion lost.
    REQUIRE_EQ(svtest::sv().drop_completions("sv0", 100), 0);
    std::string why;
    CHECK_EQ(run_one(*p.a, seg, OPCODE_READ, a.data(), remote, 4096, &why), STATUS_FAILED);
    CHECK(why.find("NIC sv0") != std::string::npos);
    CHECK(why.find("no completion within 1000 ms") != std::string::npos);
    CHECK(why.find("MC_SLICE_TIMEOUT") != std::string::npos);
    REQUIRE_EQ(svtest::sv().drop_completions("sv0", 0), 0);
    // A stalled NIC: the late flushes of the timed-out WRs are absorbed.
    REQUIRE_EQ(svtest::sv().set_paused("sv0", 1), 0);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n, &why), STATUS_FAILED);
    CHECK(why.find("no completion") != std::string::npos);
    REQUIRE_EQ(svtest::sv().set_paused("sv0", 0), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mctest::fill_random(a, 91);
    CHECK_EQ(run_one(*p.a, seg, OPCODE_WRITE, a.data(), remote, n, &why), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(a.data(), dst.data(), n), 0);
    p.a->unregister_memory(a.data());
    p.b->unregister_memory(dst.data());
}
