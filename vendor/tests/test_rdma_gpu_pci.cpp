// The "cuda:<ordinal>" entries of the RDMA priority matrix
// (docs/wire-protocol.md): the driver's PCI bus id in sysfs form, its resolution against a
// sysfs root, discovery without libcuda, and an end-to-end run over
// softverbs where two fake GPUs (stand-ins: a directory with numa_node in
// the fake sysfs, no device behind it) sit behind the bridges of two NICs.
#include <dlfcn.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/host_port.h"
#include "core/batch.h"
#include "core/segment_descriptor.h"
#include "engine_fixture.h"
#include "gpu/gpu.h"
#include "handshake/frame.h"
#include "handshake/handshake_client.h"
#include "rdma_engine_fixture.h"
#include "rdma_tmp_dir.h"
#include "transport/rdma/gpu_pci.h"
#include "transport/rdma/rdma_transport.h"

using namespace mcrs::rdma;
using rdmatest::EnvGuard;
using rdmatest::rdma_cfg;
using rdmatest::sv_wrs;

namespace {

namespace fs = std::filesystem;

// A stand-in GPU PCI function in softverbs' fake sysfs:
// devices/pci0000:00/<bridge>/<bus id> with numa_node, and its
// bus/pci/devices link (removed with the tree at the next configure).
void add_fake_gpu(const std::string &bridge, const std::string &bus_id, int numa) {
    fs::path root = svtest::sv().sysfs_root();
    std::string rel = "devices/pci0000:00/" + bridge + "/" + bus_id;
    fs::create_directories(root / rel);
    std::ofstream(root / rel / "numa_node") << numa << "\n";
    std::ofstream(root / rel / "class") << "0x030200\n";
    fs::create_directory_symlink("../../../" + rel, root / "bus/pci/devices" / bus_id);
}

SysfsRoots softverbs_roots() {
    SysfsRoots r;
    r.pci_devices = std::string(svtest::sv().sysfs_root()) + "/bus/pci/devices";
    return r;
}

// sv0 behind bridge 05 on node 0, sv1 behind bridge 85 on node `numa1`;
// GPU 0 behind bridge 05 (node 0), GPU 1 behind bridge 85 (node `numa1`).
// sv2/sv3 for the peer.
void configure_two_branches(int numa1) {
    std::string n1 = std::to_string(numa1);
    std::string spec = "sv0:roce:numa=0:bridge=0000:05:00.0:pci=0000:06:00.0,"
                       "sv1:roce:numa=" + n1 + ":bridge=0000:85:00.0:pci=0000:86:00.0,"
                       "sv2:roce:numa=0,sv3:roce:numa=" + n1;
    svtest::configure(spec.c_str());
    add_fake_gpu("0000:05:00.0", "0000:07:00.0", 0);
    add_fake_gpu("0000:85:00.0", "0000:87:00.0", numa1);
}

// The driver's spelling (8-digit domain, upper case), as a test source.
std::function<std::vector<GpuInfo>()> two_fake_gpus() {
    return [] { return gpus_from_bus_ids({"00000000:07:00.0", "00000000:87:00.0"}, softverbs_roots()); };
}

RdmaTransportOptions opts(std::vector<std::string> allow) {
    RdmaTransportOptions o;
    o.server_name = "127.0.0.1:1";
    o.allow = std::move(allow);
    o.verbs_library = svtest::softverbs_path();
    return o;
}

std::string entry_text(const mcrs::Json &matrix, const char *key) {
    const mcrs::Json *e = matrix.find(key);
    return e ? e->dump() : "(absent)";
}

size_t cuda_keys(const Topology &t) {
    size_t n = 0;
    for (const auto &kv : t.entries()) n += kv.first.compare(0, 5, "cuda:") == 0;
    return n;
}

}  // namespace

TEST(rdma_gpu_pci_bus_id_canonical_form) {
    auto c = [](const char *s) { return canonical_pci_bus_id(s).value_or("(none)"); };
    CHECK_EQ(c("00000000:3B:00.0"), std::string("0000:3b:00.0"));
    CHECK_EQ(c("0000:3B:00.0"), std::string("0000:3b:00.0"));
    CHECK_EQ(c(" 0000:af:1f.7\n"), std::string("0000:af:1f.7"));
    CHECK_EQ(c("3b:00.0"), std::string("0000:3b:00.0"));       // no domain: 0
    CHECK_EQ(c("0001:3b:00.0"), std::string("0001:3b:00.0"));
    CHECK_EQ(c("00010000:E1:00.0"), std::string("10000:e1:00.0"));  // VMD domains: 5 digits, as sysfs
    for (const char *bad : {"", "garbage", "0000:3b:00", "0000:3b.00.0", "0000:3b:20.0", "0000:3b:00.8",
                            "0000:13b:00.0", "000000000:3b:00.0", "0000:3g:00.0", "0000:3b:00.0x",
                            "0000::00.0", "0000:3b:00.0/..", ":3b:00.0"})
        CHECK(!canonical_pci_bus_id(bad));
}

TEST(rdma_gpu_pci_resolves_against_sysfs_root) {
    mctest::TmpDir t;
    t.write("devices/pci0000:00/0000:05:00.0/0000:07:00.0/numa_node", "1\n");
    t.write("devices/pci0000:00/0000:05:00.0/0000:08:00.0/numa_node", "-1\n");
    t.symlink("../../../devices/pci0000:00/0000:05:00.0/0000:07:00.0", "bus/pci/devices/0000:07:00.0");
    t.symlink("../../../devices/pci0000:00/0000:05:00.0/0000:08:00.0", "bus/pci/devices/0000:08:00.0");
    SysfsRoots r;
    r.pci_devices = t.at("bus/pci/devices");
    std::vector<GpuInfo> g = gpus_from_bus_ids({"00000000:07:00.0", "0000:08:00.0", "0000:09:00.0", "bogus"}, r);
    REQUIRE_EQ(g.size(), 4u);
    for (int i = 0; i < 4; ++i) CHECK_EQ(g[i].ordinal, i);
    CHECK_EQ(g[0].pci_bus_id, std::string("0000:07:00.0"));
    CHECK_EQ(g[0].pci_path, real_path(t.at("devices/pci0000:00/0000:05:00.0/0000:07:00.0")));
    CHECK_EQ(g[0].numa_node, 1);
    CHECK(!g[1].pci_path.empty());
    CHECK_EQ(g[1].numa_node, -1);  // the kernel's "unknown"
    CHECK(g[2].pci_path.empty());  // not on this tree
    CHECK_EQ(g[2].numa_node, -1);
    CHECK_EQ(g[3].pci_bus_id, std::string("bogus"));
    CHECK(g[3].pci_path.empty());
}

TEST(rdma_gpu_entries_absent_without_cuda_driver) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=1");
    std::vector<std::string> ids;
    std::string err;
    bool driver = mcrs::gpu::driver_pci_bus_ids(ids, err);
    if (mcrs::gpu::build_major() == 0) CHECK(!driver);  // CPU builds never initialize CUDA
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) CHECK(!driver);
    if (cuda) dlclose(cuda);
    // The real source (no seam): discovery works, cuda entries only for
    // GPUs the driver shows.
    RdmaTransport t(opts({"sv0", "sv1"}));
    CHECK_EQ(t.nic_count(), 2u);
    CHECK(t.topology().entries().count("cpu:0") == 1);
    CHECK_EQ(cuda_keys(t.topology()), driver ? ids.size() : 0u);
    if (!driver) CHECK(list_cuda_gpus().empty());
}

TEST(rdma_gpu_entries_prefer_nic_nearest_on_pci) {
    // Every NIC and GPU on node 0: only the PCI distance tells them apart.
    configure_two_branches(0);
    RdmaTransportOptions o = opts({"sv0", "sv1"});
    o.gpu_source = two_fake_gpus();
    RdmaTransport t(o);
    mcrs::Json m = t.topology().to_json();
    CHECK_EQ(entry_text(m, "cuda:0"), std::string(R"([["sv0"],["sv1"]])"));
    CHECK_EQ(entry_text(m, "cuda:1"), std::string(R"([["sv1"],["sv0"]])"));
    CHECK_EQ(entry_text(m, "cpu:0"), std::string(R"([["sv0","sv1"],[]])"));
}

TEST(rdma_gpu_buffer_stripes_over_nic_near_its_gpu) {
    configure_two_branches(1);
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    EnvGuard topo("MC_CUSTOM_TOPO_JSON", nullptr);
    // The peer: a whole engine on sv2/sv3.
    mcrs::TransferEngine b(rdma_cfg({"sv2", "sv3"}));
    const size_t n = 1u << 20;
    std::vector<char> src(n), dst(n);
    mctest::fill_random(src, 71);
    b.register_memory(dst.data(), n, "cpu:0", true);
    mcrs::HostPort hp = mcrs::parse_host_port(b.segment_name());
    mcrs::HandshakeClientOptions ho;
    ho.timeout_ms = 3000;
    // Ours: a bare transport with the two stand-in GPUs.
    RdmaTransportOptions o = opts({"sv0", "sv1"});
    o.gpu_source = two_fake_gpus();
    o.send_handshake = [hp, ho](const std::string &, const mcrs::Json &body, uint32_t) {
        return mcrs::handshake_request(hp.host, hp.port, mcrs::kHsConnection, body, ho);
    };
    RdmaTransport a(o);
    // Published: cuda:N prefers the NIC behind GPU N's bridge.
    mcrs::SegmentDesc mine;
    a.fill_descriptor(mine);
    CHECK_EQ(entry_text(mine.priority_matrix, "cuda:0"), std::string(R"([["sv0"],["sv1"]])"));
    CHECK_EQ(entry_text(mine.priority_matrix, "cuda:1"), std::string(R"([["sv1"],["sv0"]])"));
    CHECK_EQ(entry_text(mine.priority_matrix, "cpu:1"), std::string(R"([["sv1"],["sv0"]])"));
    // Host memory stands in for GPU 1's (the location is what counts).
    a.register_region(reinterpret_cast<uint64_t>(src.data()), n, -1, true, "cuda:1");
    auto peer = std::make_shared<const mcrs::SegmentDesc>(mcrs::decode_segment_desc(
        mcrs::handshake_request(hp.host, hp.port, mcrs::kHsMetadata, mcrs::Json::object(), ho)));
    for (const char *loc : {"cuda:1", "cuda:0"}) {
        if (std::string(loc) == "cuda:0") {
            a.deregister_region(reinterpret_cast<uint64_t>(src.data()));
            a.register_region(reinterpret_cast<uint64_t>(src.data()), n, -1, true, loc);
            mctest::fill_random(src, 72);
        }
        svtest::sv().reset_counters();
        auto batch = std::make_shared<mcrs::Batch>(1, 1);
        REQUIRE(batch->reserve(1).has_value());
        std::vector<mcrs::TransferItem> items(1);
        items[0].batch = batch;
        items[0].opcode = 1;  // WRITE
        items[0].local = src.data();
        items[0].remote_addr = reinterpret_cast<uint64_t>(dst.data());
        items[0].length = n;
        a.submit(peer, items);
        REQUIRE(batch->wait(20000));
        uint64_t bytes = 0;
        CHECK_EQ(batch->observe(0, &bytes), static_cast<int>(mcrs::kTaskCompleted));
        CHECK_EQ(std::memcmp(src.data(), dst.data(), n), 0);
        bool one = std::string(loc) == "cuda:1";
        CHECK_EQ(sv_wrs(one ? "sv1" : "sv0"), 16u);
        CHECK_EQ(sv_wrs(one ? "sv0" : "sv1"), 0u);
    }
    a.deregister_region(reinterpret_cast<uint64_t>(src.data()));
    b.unregister_memory(dst.data());
}
