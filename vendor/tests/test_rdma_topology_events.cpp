// Port down/up async events and what the engine publishes
// (docs/wire-protocol.md, RDMA priority matrix): the NIC's usable flag in
// topology_json, its removal from the
// descriptor's matrix with devices[]/rkey[] kept consistent, and a peer
// reading the fresh descriptor using only the remaining NIC.
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "core/segment_descriptor.h"
#include "engine_fixture.h"
#include "rdma_engine_fixture.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/topology.h"

using rdmatest::EnvGuard;
using rdmatest::make_pair_engines;
using rdmatest::Pair;
using rdmatest::run_one;
using rdmatest::sv_served;

namespace {

bool usable_in_topology(mcrs::TransferEngine &e, const std::string &nic) {
    mcrs::Json t = e.rdma()->topology_json();
    const mcrs::Json *devs = t.find("devices");
    if (!devs || !devs->get_array()) return false;
    for (const mcrs::Json &d : *devs->get_array()) {
        const mcrs::Json *name = d.find("name");
        bool usable = false;
        if (name && name->get_string() && *name->get_string() == nic && d.find("usable") &&
            d.find("usable")->get_bool(usable))
            return usable;
    }
    return false;
}

bool wait_usable(mcrs::TransferEngine &e, const std::string &nic, bool want) {
    for (int i = 0; i < 200; ++i) {
        if (usable_in_topology(e, nic) == want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

std::set<std::string> matrix_names(const mcrs::Json &m) {
    auto t = mcrs::rdma::Topology::from_json(m, mcrs::kErrMetadata, "test");
    return {t.hca_names().begin(), t.hca_names().end()};
}

}  // namespace

TEST(rdma_port_events_refresh_published_topology) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=1,sv2:roce:numa=0");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", nullptr);
    const size_t n = 1u << 20;
    std::vector<char> buf(n), back(n);
    mctest::fill_random(buf, 111);
    Pair p = make_pair_engines({"sv0", "sv1"}, {"sv2"});
    p.a->register_memory(buf.data(), n, "cpu:0", true);
    p.b->register_memory(back.data(), n, "cpu:0", true);
    mcrs::SegmentDesc before = p.a->local_descriptor();
    REQUIRE_EQ(before.devices.size(), 2u);
    REQUIRE_EQ(before.buffers.size(), 1u);
    uint32_t rkey_sv1 = 0;
    for (size_t i = 0; i < before.devices.size(); ++i)
        if (before.devices[i].name == "sv1") rkey_sv1 = before.buffers[0].rkey[i];

    REQUIRE_EQ(svtest::sv().set_port_state("sv0", 0), 0);
    REQUIRE(wait_usable(*p.a, "sv0", false));
    CHECK(usable_in_topology(*p.a, "sv1"));
    // sv0 is gone from devices[], the matrix and the keys, consistently.
    mcrs::SegmentDesc down = p.a->local_descriptor();
    REQUIRE_EQ(down.devices.size(), 1u);
    CHECK_EQ(down.devices[0].name, std::string("sv1"));
    CHECK(matrix_names(down.priority_matrix) == std::set<std::string>{"sv1"});
    REQUIRE_EQ(down.buffers[0].rkey.size(), 1u);
    CHECK_EQ(down.buffers[0].rkey[0], rkey_sv1);
    CHECK_EQ(down.buffers[0].lkey.size(), 1u);
    // A peer with the fresh descriptor reads over sv1 only.
    int32_t seg = p.b->open_segment(p.a->segment_name(), /*no_cache=*/true);
    svtest::sv().reset_counters();
    CHECK_EQ(run_one(*p.b, seg, OPCODE_READ, back.data(), reinterpret_cast<uint64_t>(buf.data()), n),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(buf.data(), back.data(), n), 0);
    CHECK_EQ(sv_served("sv0"), 0u);
    CHECK_EQ(sv_served("sv1"), 16u);
    // Port back up: both NICs published again, in the original order.
    REQUIRE_EQ(svtest::sv().set_port_state("sv0", 1), 0);
    REQUIRE(wait_usable(*p.a, "sv0", true));
    mcrs::SegmentDesc up = p.a->local_descriptor();
    REQUIRE_EQ(up.devices.size(), 2u);
    CHECK_EQ(up.devices[0].name, before.devices[0].name);
    CHECK(up.buffers[0].rkey == before.buffers[0].rkey);
    CHECK_EQ(up.priority_matrix.dump(), before.priority_matrix.dump());
    p.b->close_segment(seg);
    p.a->unregister_memory(buf.data());
    p.b->unregister_memory(back.data());
}

namespace {

std::string published_gid(mcrs::TransferEngine &e, const std::string &nic) {
    for (const auto &d : e.local_descriptor().devices)
        if (d.name == nic) return d.gid;
    return "";
}

}  // namespace

// GID_CHANGE re-reads the port, re-selects the GID and republishes
// (docs/wire-protocol.md, RDMA GID selection);
// endpoints built on the old GID are torn down so both directions
// re-handshake and still move verified data.
TEST(rdma_gid_change_republishes_and_reconnects) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=0");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", nullptr);
    EnvGuard gidx("MC_GID_INDEX", nullptr);
    const size_t n = 1u << 20;
    std::vector<char> src(n), dst(n), back(n);
    Pair p = make_pair_engines({"sv0"}, {"sv1"});
    p.a->register_memory(src.data(), n, "cpu:0", true);
    p.a->register_memory(back.data(), n, "cpu:0", true);
    p.b->register_memory(dst.data(), n, "cpu:0", true);
    int32_t seg_b = p.a->open_segment(p.b->segment_name(), false);
    int32_t seg_a = p.b->open_segment(p.a->segment_name(), false);
    uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    mctest::fill_random(src, 71);
    REQUIRE_EQ(run_one(*p.a, seg_b, OPCODE_WRITE, src.data(), remote, n), STATUS_COMPLETED);
    REQUIRE_EQ(run_one(*p.b, seg_a, OPCODE_READ, dst.data(), reinterpret_cast<uint64_t>(src.data()), n),
               STATUS_COMPLETED);
    std::string before = published_gid(*p.a, "sv0");
    REQUIRE(!before.empty());

    // Both entries of pair 0 (the only populated ones) move to a new GID.
    mcrs::rdma::Gid fresh{};
    fresh[0] = 0xfe;
    fresh[1] = 0x80;
    fresh[13] = 0x77;
    fresh[14] = 0x00;
    fresh[15] = 0x01;
    std::string want = mcrs::rdma::format_gid(fresh);
    REQUIRE(want != before);
    REQUIRE_EQ(svtest::sv().set_gid("sv0", 0, fresh.data()), 0);
    REQUIRE_EQ(svtest::sv().set_gid("sv0", 1, fresh.data()), 0);
    for (int i = 0; i < 200 && published_gid(*p.a, "sv0") != want; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK_EQ(published_gid(*p.a, "sv0"), want);
    CHECK_EQ(usable_in_topology(*p.a, "sv0"), true);

    // a -> b over a fresh endpoint (b's side gets the new GID in the handshake).
    mctest::fill_random(src, 72);
    std::string why;
    CHECK_EQ(run_one(*p.a, seg_b, OPCODE_WRITE, src.data(), remote, n, &why), STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(src.data(), dst.data(), n), 0);
    // b -> a: b's cached endpoint still targets the old GID; its failure
    // makes b re-handshake and the retry lands.
    mctest::fill_random(dst, 73);
    CHECK_EQ(run_one(*p.b, seg_a, OPCODE_WRITE, dst.data(), reinterpret_cast<uint64_t>(back.data()), n, &why),
             STATUS_COMPLETED);
    CHECK_EQ(std::memcmp(dst.data(), back.data(), n), 0);
    svtest::sv().reset_faults();
    p.a->unregister_memory(src.data());
    p.a->unregister_memory(back.data());
    p.b->unregister_memory(dst.data());
}
