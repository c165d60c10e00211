// The upstream-named calls that used to be stubs: automatic transport
// choice at creation (RDMA over the softverbs stand-in NICs, else TCP),
// per-NIC load, the links report, discovery, uninstalling, the EFA
// warm-up; and the extension's managed buffers and synchronous transfers.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine_fixture.h"
#include "mooncake_ext.h"
#include "rdma_engine_fixture.h"
#include "softverbs_fixture.h"
#include "transfer_engine_c.h"

using mctest::make_engine;
using mctest::segment_name;
using rdmatest::EnvGuard;

namespace {

uint32_t transports(transfer_engine_t e) {
    uint32_t p = 0xffffffffu;
    if (mc_engine_transports(e, &p) != 0) return 0xffffffffu;
    return p;
}

// An engine as upstream's users create it, on the stand-in NIC `nic`.
transfer_engine_t auto_engine(const char *nic) {
    EnvGuard f("MC_TE_FILTERS", nic);
    return createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.2", 4242, 1);
}

std::string links(transfer_engine_t e, int json) {
    std::vector<char> buf(16384);
    if (showLinks(e, buf.data(), buf.size(), json) != 0) return "<error>";
    return buf.data();
}

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(capi_auto_discover_installs_rdma_and_reports_nic_load) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=0");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    transfer_engine_t a = auto_engine("sv0");
    transfer_engine_t b = auto_engine("sv1");
    REQUIRE(a && b);
    CHECK_EQ(transports(a), MC_PROTOCOL_RDMA);
    // ip_or_host_name and rpc_port are not used (upstream's P2P rule).
    CHECK(contains(segment_name(a), "127.0.0.1:"));
    std::vector<char> src(1 << 20), dst(1 << 20);
    mctest::fill_random(src, 7);
    REQUIRE_EQ(registerLocalMemory(a, src.data(), src.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(b, dst.data(), dst.size(), "cpu:0", 1), 0);
    segment_id_t seg = openSegment(a, segment_name(b).c_str());
    REQUIRE(seg > 0);
    transfer_request w{OPCODE_WRITE, src.data(), seg, reinterpret_cast<uint64_t>(dst.data()), src.size()};
    auto st = mctest::run_batch(a, {w});
    REQUIRE_EQ(st.size(), 1u);
    CHECK_EQ(st[0], STATUS_COMPLETED);
    CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);

    nic_load_stat_t stats[4];
    size_t count = 4;
    CHECK_EQ(getNicLoadStats(a, stats, &count), 0);
    REQUIRE_EQ(count, 1u);
    CHECK_EQ(std::string(stats[0].device_name), std::string("sv0"));
    CHECK_EQ(stats[0].inflight_bytes, 0u);    // all completed
    CHECK(stats[0].ewma_bandwidth_bps > 0.0);  // learnt from the write
    size_t none = 0;                           // a short array: the count only
    CHECK_EQ(getNicLoadStats(a, stats, &none), 0);
    CHECK_EQ(none, 1u);

    std::string j = links(a, 1);
    CHECK(contains(j, "\"device\":\"sv0\""));
    CHECK(contains(j, "\"source\":\"rdma_transport\""));
    CHECK(contains(j, "\"transports\":[\"rdma\"]"));
    CHECK(contains(links(a, 0), "=== Local NICs ==="));
    char tiny[8];
    CHECK_EQ(showLinks(a, tiny, sizeof tiny, 1), 0);  // truncated, terminated
    CHECK_EQ(std::strlen(tiny), 7u);
    CHECK_EQ(showLinks(a, nullptr, 0, 1), -1);
    CHECK_EQ(discoverTopology(a), 0);

    // Uninstalled: new transfers have no route to the RDMA-only peer.
    CHECK_EQ(uninstallTransport(a, "rdma"), 0);
    CHECK_EQ(transports(a), 0u);
    batch_id_t bid = allocateBatchID(a, 1);
    CHECK_EQ(submitTransfer(a, bid, &w, 1), MC_STATUS_NOT_SUPPORTED_TRANSPORT);
    CHECK_EQ(freeBatchID(a, bid), 0);
    count = 4;
    CHECK_EQ(getNicLoadStats(a, stats, &count), 0);
    CHECK_EQ(count, 0u);
    CHECK_EQ(uninstallTransport(a, "rdma"), ERR_INVALID_ARGUMENT);
    CHECK(contains(mc_last_error_message(), "not installed"));
    {
        // Installed again: transfers flow again.
        EnvGuard f("MC_TE_FILTERS", "sv0");
        CHECK(installTransport(a, "rdma", nullptr) != nullptr);
    }
    std::memset(dst.data(), 0, dst.size());
    st = mctest::run_batch(a, {w});
    REQUIRE_EQ(st.size(), 1u);
    CHECK_EQ(st[0], STATUS_COMPLETED);
    CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
    destroyTransferEngine(a);
    destroyTransferEngine(b);
}

TEST(capi_auto_discover_falls_back_to_tcp_and_honours_overrides) {
    svtest::configure("sv0:roce:numa=0");
    {
        EnvGuard lib("MC_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1");
        transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
        REQUIRE(e);
        CHECK_EQ(transports(e), MC_PROTOCOL_TCP);
        CHECK_EQ(discoverTopology(e), 0);  // ran; found nothing
        std::string j = links(e, 1);
        CHECK(contains(j, "\"local_nics\":[]"));
        CHECK(contains(j, "/nonexistent/libibverbs.so.1"));
        CHECK(contains(links(e, 0), "(no RDMA devices found)"));
        destroyTransferEngine(e);
        EnvGuard hca("MC_FORCE_HCA", "1");
        CHECK(createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1) == nullptr);
        CHECK(contains(mc_last_error_message(), "MC_FORCE_HCA"));
    }
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    {
        EnvGuard tcp("MC_FORCE_TCP", "1");
        transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
        REQUIRE(e);
        CHECK_EQ(transports(e), MC_PROTOCOL_TCP);
        // Discovery without the transport: the NIC is listed, from topology.
        CHECK_EQ(discoverTopology(e), 0);
        std::string j = links(e, 1);
        CHECK(contains(j, "\"device\":\"sv0\""));
        CHECK(contains(j, "\"source\":\"topology\""));
        destroyTransferEngine(e);
    }
}

TEST(capi_uninstall_tcp_and_bad_protocols) {
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    CHECK_EQ(uninstallTransport(e, "efa"), ERR_INVALID_ARGUMENT);
    CHECK(contains(mc_last_error_message(), "unknown transport 'efa'"));
    CHECK_EQ(uninstallTransport(e, nullptr), ERR_INVALID_ARGUMENT);
    CHECK_EQ(uninstallTransport(nullptr, "tcp"), ERR_INVALID_ARGUMENT);
    CHECK_EQ(uninstallTransport(e, "tcp"), 0);
    CHECK_EQ(transports(e), 0u);
    CHECK_EQ(uninstallTransport(e, "tcp"), ERR_INVALID_ARGUMENT);
    CHECK(installTransport(e, "tcp", nullptr) == nullptr);
    CHECK(contains(mc_last_error_message(), "uninstalled"));
    CHECK_EQ(warmupEfaSegment(e, "peer:1"), ERR_NOT_IMPLEMENTED);
    CHECK(contains(mc_last_error_message(), "peer:1"));
    destroyTransferEngine(e);
}

TEST(capi_ext_managed_buffers_and_sync_transfers) {
    transfer_engine_t a = make_engine();
    transfer_engine_t b = make_engine();
    REQUIRE(a && b);
    void *pa = nullptr, *pb = nullptr;
    const size_t n = 256 * 1024;
    REQUIRE_EQ(mc_managed_buffer_alloc(a, n, nullptr, &pa), 0);
    REQUIRE_EQ(mc_managed_buffer_alloc(b, n, "cpu:0", &pb), 0);
    REQUIRE(pa && pb);
    CHECK_EQ(reinterpret_cast<uintptr_t>(pa) % 4096, 0u);
    CHECK_EQ(static_cast<unsigned char *>(pb)[n - 1], 0u);  // zeroed
    for (size_t i = 0; i < n; ++i) static_cast<unsigned char *>(pa)[i] = static_cast<unsigned char>(i * 7);
    std::string peer = segment_name(b);
    uint64_t rb = reinterpret_cast<uint64_t>(pb);
    CHECK_EQ(mc_transfer_sync(a, peer.c_str(), OPCODE_WRITE, pa, rb, n), 0);
    CHECK(std::memcmp(pa, pb, n) == 0);
    std::memset(pa, 0, n);
    CHECK_EQ(mc_transfer_sync(a, peer.c_str(), OPCODE_READ, pa, rb + 16, 64), 0);
    CHECK(std::memcmp(pa, static_cast<char *>(pb) + 16, 64) == 0);
    // Failures say why.
    CHECK_EQ(mc_transfer_sync(a, peer.c_str(), OPCODE_READ, pa, rb + n - 8, 64), MC_ERR_TRANSFER_FAILED);
    CHECK(contains(mc_last_error_message(), "mc_transfer_sync: read of 64 bytes"));
    CHECK_EQ(mc_transfer_sync(a, peer.c_str(), 7, pa, rb, 8), ERR_INVALID_ARGUMENT);
    CHECK(contains(mc_last_error_message(), "opcode 7"));
    char unregistered[16];
    CHECK_EQ(mc_transfer_sync(a, peer.c_str(), OPCODE_READ, unregistered, rb, 8), ERR_ADDRESS_NOT_REGISTERED);
    CHECK_EQ(mc_transfer_sync(a, nullptr, OPCODE_READ, pa, rb, 8), ERR_INVALID_ARGUMENT);
    CHECK_EQ(mc_managed_buffer_alloc(a, 0, nullptr, &pa), ERR_INVALID_ARGUMENT);
    CHECK(pa == nullptr);
    // closeSegment, as upstream: 0, and the id stays usable.
    segment_id_t seg = openSegment(a, peer.c_str());
    CHECK_EQ(closeSegment(a, seg), 0);
    CHECK_EQ(openSegment(a, peer.c_str()), seg);
    // Frees: length checked, only managed buffers.
    CHECK_EQ(mc_managed_buffer_free(b, pb, n - 1), ERR_INVALID_ARGUMENT);
    CHECK_EQ(mc_managed_buffer_free(b, unregistered, 16), ERR_ADDRESS_NOT_REGISTERED);
    CHECK_EQ(mc_managed_buffer_free(b, pb, n), 0);
    CHECK_EQ(mc_managed_buffer_free(b, pb, n), ERR_ADDRESS_NOT_REGISTERED);
    // The peer's buffer is gone: the next write fails with the reason.
    void *pa2 = nullptr;
    REQUIRE_EQ(mc_managed_buffer_alloc(a, 64, nullptr, &pa2), 0);
    CHECK_EQ(mc_transfer_sync(a, peer.c_str(), OPCODE_WRITE, pa2, rb, 64), MC_ERR_TRANSFER_FAILED);
    CHECK(contains(mc_last_error_message(), "failed"));
    destroyTransferEngine(a);  // frees pa2 with it
    destroyTransferEngine(b);
}
