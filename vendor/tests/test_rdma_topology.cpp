#include <map>
#include <set>

#include "common/error.h"
#include "rdma_tmp_dir.h"
#include "test_util.h"
#include "transport/rdma/topology.h"

using namespace mcrs::rdma;
using mcrs::Error;
using mcrs::Json;

namespace {

const std::string kRoot = "/sys/devices/pci0000:00";

// 2 NUMA nodes; mlx5_0/1 on node 0 behind different switches, mlx5_2 on
// node 1, mlx5_3 unusable.
std::vector<NicInfo> sample_nics() {
    return {
        {"mlx5_0", LinkLayer::RoCE, 0, kRoot + "/0000:00:01.0/0000:01:00.0/0000:02:00.0", true},
        {"mlx5_1", LinkLayer::RoCE, 0, kRoot + "/0000:00:02.0/0000:05:00.0/0000:06:00.0", true},
        {"mlx5_2", LinkLayer::RoCE, 1, "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", true},
        {"mlx5_3", LinkLayer::RoCE, 1, "/sys/devices/pci0000:80/0000:80:02.0/0000:82:00.0", false},
    };
}

std::vector<GpuInfo> sample_gpus() {
    return {
        // Same switch as mlx5_1.
        {0, "0000:07:00.0", kRoot + "/0000:00:02.0/0000:05:00.0/0000:07:00.0", 0},
        // Node 1: the only candidate there is mlx5_2.
        {1, "0000:83:00.0", "/sys/devices/pci0000:80/0000:80:03.0/0000:83:00.0", 1},
        // Unknown node: every NIC is a candidate; nearest is mlx5_0.
        {2, "0000:03:00.0", kRoot + "/0000:00:01.0/0000:01:00.0/0000:03:00.0", -1},
        // No PCI path: every candidate on its node is preferred.
        {3, "0000:09:00.0", "", 0},
    };
}

bool throws_code(const std::function<void()> &fn, int code, const std::string &needle) {
    try {
        fn();
    } catch (const Error &e) {
        if (e.code() != code) return false;
        if (std::string(e.what()).find(needle) == std::string::npos) {
            std::fprintf(stderr, "    message was: %s\n", e.what());
            return false;
        }
        return true;
    }
    return false;
}

}  // namespace

TEST(rdma_topology_pci_distance) {
    struct {
        const char *a, *b;
        int d;
    } cases[] = {
        {"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", "/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0", 2},
        {"/sys/devices/pci0000:00/0000:00:01.0", "/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0", 1},
        {"/sys/devices/pci0000:00/0000:00:01.0/x", "/sys/devices/pci0000:80/0000:80:01.0/y", 6},
        {"/a/b", "/a/b", 0},
        {"/a//b/", "/a/b", 0},
        // Component-wise: shared characters inside a name do not count.
        {"/r/0000:00:01.0/g", "/r/0000:00:02.0/n", 4},
        {"", "/a", -1},
        {"/a", "", -1},
    };
    for (const auto &c : cases) {
        int got = pci_distance(c.a, c.b);
        if (got != c.d)
            mctest::record_failure(__FILE__, __LINE__,
                                   std::string(c.a) + " vs " + c.b + " = " + std::to_string(got));
        CHECK_EQ(pci_distance(c.b, c.a), got);
    }
}

TEST(rdma_topology_discover_matrix) {
    Topology t = Topology::discover(sample_nics(), {0, 1}, sample_gpus());
    std::string want =
        "{\"cpu:0\":[[\"mlx5_0\",\"mlx5_1\"],[\"mlx5_2\"]],"
        "\"cpu:1\":[[\"mlx5_2\"],[\"mlx5_0\",\"mlx5_1\"]],"
        "\"cuda:0\":[[\"mlx5_1\"],[\"mlx5_0\",\"mlx5_2\"]],"
        "\"cuda:1\":[[\"mlx5_2\"],[\"mlx5_0\",\"mlx5_1\"]],"
        "\"cuda:2\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_2\"]],"
        "\"cuda:3\":[[\"mlx5_0\",\"mlx5_1\"],[\"mlx5_2\"]]}";
    CHECK_EQ(t.to_json().dump(), want);
    // The unusable NIC is nowhere.
    CHECK_EQ(t.hca_index("mlx5_3"), -1);
    // HCA order: sorted locations, preferred then available, first sight.
    std::vector<std::string> order = {"mlx5_0", "mlx5_1", "mlx5_2"};
    CHECK(t.hca_names() == order);
    CHECK_EQ(t.hca_index("mlx5_2"), 2);
    // Another GPU prefix.
    Topology h = Topology::discover(sample_nics(), {0, 1}, {sample_gpus()[0]}, "hip");
    CHECK(h.entries().count("hip:0") == 1);
    CHECK(h.entries().count("cuda:0") == 0);
}

TEST(rdma_topology_hca_order_is_a_function_of_the_matrix) {
    // NICs on node 1 only: cpu:0 lists them as available, in input order.
    std::vector<NicInfo> nics = {{"mlx5_b", LinkLayer::IB, 1, "", true},
                                 {"mlx5_a", LinkLayer::IB, 0, "", true}};
    Topology t = Topology::discover(nics, {0, 1}, {});
    std::vector<std::string> want = {"mlx5_a", "mlx5_b"};  // cpu:0 preferred first
    CHECK(t.hca_names() == want);
    // Reparsing the published matrix gives the same order, so devices[],
    // rkey[] and lkey[] published in hca order are consistent for any reader
    // that resolves from the matrix in sorted order.
    Topology back = Topology::from_json(t.to_json(), mcrs::kErrMetadata, "m");
    CHECK(back.hca_names() == t.hca_names());
    CHECK(back.entries() == t.entries());
    // The set of matrix names equals the set of devices.
    std::set<std::string> names;
    for (const auto &kv : back.entries())
        for (const auto *l : {&kv.second.preferred, &kv.second.available}) names.insert(l->begin(), l->end());
    CHECK_EQ(names.size(), back.device_count());
    // No NUMA information at all: one cpu:0 entry, nothing lost.
    Topology flat = Topology::discover(nics, {}, {});
    CHECK_EQ(flat.entries().size(), size_t(1));
    CHECK_EQ(flat.device_count(), size_t(2));
    CHECK(Topology::discover({}, {0}, {}).empty());
}

TEST(rdma_topology_json_rejects_malformed) {
    struct {
        const char *json;
        const char *needle;
    } bad[] = {
        {"[]", "must be a JSON object"},
        {"\"x\"", "must be a JSON object"},
        {"null", "must be a JSON object"},
        {"{\"cpu:0\":[]}", "exactly two arrays"},
        {"{\"cpu:0\":[[\"a\"]]}", "exactly two arrays"},
        {"{\"cpu:0\":[[\"a\"],[],[]]}", "exactly two arrays"},
        {"{\"cpu:0\":{\"a\":1}}", "exactly two arrays"},
        {"{\"cpu:0\":\"mlx5_0\"}", "exactly two arrays"},
        {"{\"cpu:0\":[\"mlx5_0\",[]]}", "preferred list is not an array"},
        {"{\"cpu:0\":[[],5]}", "available list is not an array"},
        {"{\"cpu:0\":[[1],[]]}", "preferred[0]"},
        {"{\"cpu:0\":[[\"a\"],[null]]}", "available[0]"},
        {"{\"cpu:0\":[[\"\"],[]]}", "preferred[0]"},
        {"{\"\":[[\"a\"],[]]}", "location key is empty"},
        {"{\"cpu:1\":[[\"a\"],[]],\"cpu:0\":[[[\"a\"]],[]]}", "location \"cpu:0\""},
    };
    for (const auto &b : bad) {
        bool ok = throws_code([&] { Topology::from_json_text(b.json, mcrs::kErrMetadata, "peer matrix"); },
                              mcrs::kErrMetadata, b.needle);
        if (!ok) mctest::record_failure(__FILE__, __LINE__, std::string("not rejected clearly: ") + b.json);
    }
    std::string long_name(256, 'x');
    CHECK(throws_code([&] {
        Topology::from_json_text("{\"cpu:0\":[[\"" + long_name + "\"],[]]}", mcrs::kErrInvalidArgument, "t");
    }, mcrs::kErrInvalidArgument, "at most 255"));
    CHECK(throws_code([&] { Topology::from_json_text("{not json", mcrs::kErrInvalidArgument, "arg"); },
                      mcrs::kErrInvalidArgument, "arg: not valid JSON"));
    // Repeats inside one entry are kept once; preferred wins.
    Topology t = Topology::from_json_text("{\"cpu:0\":[[\"a\",\"a\",\"b\"],[\"b\",\"c\",\"c\"]]}",
                                          mcrs::kErrMetadata, "m");
    CHECK_EQ(t.to_json().dump(), std::string("{\"cpu:0\":[[\"a\",\"b\"],[\"c\"]]}"));
    // An empty-but-well-formed matrix is fine.
    CHECK(Topology::from_json_text("{}", mcrs::kErrMetadata, "m").empty());
}

TEST(rdma_topology_select_rule) {
    Topology t = Topology::from_json_text(
        "{\"cpu:0\":[[\"a\",\"b\"],[\"c\"]],\"cpu:1\":[[],[\"c\",\"a\"]],\"gone\":[[],[]]}",
        mcrs::kErrMetadata, "m");
    std::vector<std::string> order = {"a", "b", "c"};
    REQUIRE(t.hca_names() == order);
    // retry 0: preferred[r % n].
    CHECK_EQ(t.select("cpu:0", 0, 0), 0);
    CHECK_EQ(t.select("cpu:0", 0, 1), 1);
    CHECK_EQ(t.select("cpu:0", 0, 7), 1);
    // Empty preferred: from available.
    CHECK_EQ(t.select("cpu:1", 0, 0), 2);
    CHECK_EQ(t.select("cpu:1", 0, 1), 0);
    // retry k: (k-1) mod n over preferred ++ available.
    int walk[] = {0, 1, 2, 0, 1};
    for (int k = 1; k <= 5; ++k) CHECK_EQ(t.select("cpu:0", k, 99), walk[k - 1]);
    CHECK_EQ(t.select("cpu:1", 1, 0), 2);
    CHECK_EQ(t.select("cpu:1", 2, 0), 0);
    // Unknown location: implicit wildcard over every device.
    CHECK_EQ(t.select("cuda:7", 0, 2), 2);
    CHECK_EQ(t.select("cuda:7", 2, 0), 1);
    // A location listing no device falls back to the wildcard too.
    CHECK_EQ(t.select("gone", 0, 1), 1);
    bool exact = true;
    t.entry_for("nope", &exact);
    CHECK(!exact);
    // Exclusions (e.g. disabled devices).
    auto no_a = [](int i) { return i == 0; };
    CHECK_EQ(t.select("cpu:0", 0, 0, no_a), 1);
    CHECK_EQ(t.select("cpu:0", 1, 0, no_a), 1);  // walk forward from a
    auto only_c = [](int i) { return i != 2; };
    CHECK_EQ(t.select("cpu:0", 0, 0, only_c), 2);  // preferred all excluded -> available
    auto none = [](int) { return true; };
    CHECK_EQ(t.select("cpu:0", 0, 1, none), 1);  // all excluded: ignore exclusion
    CHECK_EQ(t.select("cpu:0", 3, 0, none), 2);
    // Negative retry behaves as 0.
    CHECK_EQ(t.select("cpu:0", -4, 1), 1);
    // Explicit "*" entry wins over the implicit wildcard.
    Topology w = Topology::from_json_text("{\"*\":[[\"c\"],[]],\"cpu:0\":[[\"a\"],[\"c\"]]}",
                                          mcrs::kErrMetadata, "m");
    CHECK_EQ(w.hca_names()[w.select("cpu:9", 0, 5)], std::string("c"));
    CHECK_EQ(Topology().select("cpu:0", 0, 0), -1);
}

TEST(rdma_topology_device_selector) {
    Topology t = Topology::from_json_text("{\"cpu:0\":[[\"a\",\"b\",\"c\"],[\"d\"]]}",
                                          mcrs::kErrMetadata, "m");
    DeviceSelector rr(t, true);
    int seq[6];
    for (int &s : seq) s = rr.select("cpu:0", 0);
    int want[] = {0, 1, 2, 0, 1, 2};
    for (int i = 0; i < 6; ++i) CHECK_EQ(seq[i], want[i]);
    CHECK_EQ(rr.select("cpu:0", 4), 3);
    DeviceSelector rnd(t, false);
    std::map<int, int> seen;
    for (int i = 0; i < 300; ++i) ++seen[rnd.select("cpu:0", 0)];
    CHECK_EQ(seen.size(), size_t(3));  // only preferred devices at retry 0
    CHECK(seen.count(3) == 0);
    for (const auto &kv : seen) CHECK(kv.second > 30);
}

TEST(rdma_topology_override_loading) {
    mctest::TmpDir d;
    d.write("topo.json", "{\"cpu:0\":[[\"mlx5_1\"],[\"mlx5_0\"]]}\n");
    d.write("bad.json", "{\"cpu:0\":[[\"mlx5_1\"]]}");
    CHECK(!load_topology_override("", ""));
    CHECK(!load_topology_override("  ", " "));
    auto f = load_topology_override("", d.at("topo.json"));
    REQUIRE(f.has_value());
    CHECK_EQ(f->hca_names()[0], std::string("mlx5_1"));
    // The JSON argument wins over the file.
    auto a = load_topology_override("{\"cpu:0\":[[\"mlx5_0\"],[]]}", d.at("topo.json"));
    REQUIRE(a.has_value());
    CHECK_EQ(a->device_count(), size_t(1));
    CHECK(throws_code([&] { load_topology_override("", d.at("missing.json")); },
                      mcrs::kErrInvalidArgument, "cannot be read"));
    CHECK(throws_code([&] { load_topology_override("", d.at("bad.json")); }, mcrs::kErrInvalidArgument,
                      "MC_CUSTOM_TOPO_JSON file"));
    // Names must be usable local devices.
    CHECK(throws_code([&] { f->require_known_devices({"mlx5_0"}, "MC_CUSTOM_TOPO_JSON"); },
                      mcrs::kErrInvalidArgument, "mlx5_1 (usable: mlx5_0)"));
    f->require_known_devices({"mlx5_0", "mlx5_1", "mlx5_2"}, "x");
}

TEST(rdma_topology_filtered_recomputes_order) {
    Topology t = Topology::discover(sample_nics(), {0, 1}, sample_gpus());
    Topology f = t.filtered([](const std::string &n) { return n != "mlx5_0"; });
    std::vector<std::string> want = {"mlx5_1", "mlx5_2"};
    CHECK(f.hca_names() == want);
    CHECK_EQ(f.to_json().find("cpu:0")->dump(), std::string("[[\"mlx5_1\"],[\"mlx5_2\"]]"));
    Topology g = t.filtered([](const std::string &n) { return n == "mlx5_2"; });
    CHECK_EQ(g.entries().size(), size_t(6));  // every entry still lists mlx5_2
    Topology none = t.filtered([](const std::string &) { return false; });
    CHECK(none.entries().empty());
}

TEST(rdma_peer_topology_maps_by_name) {
    // The peer published devices[] in an order unrelated to its matrix.
    std::vector<std::string> devices = {"mlx5_2", "mlx5_0", "mlx5_1"};
    Json m = Json::parse(
        "{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_2\",\"ghost\"]],\"cpu:1\":[[\"mlx5_2\"],[\"mlx5_0\"]],"
        "\"cuda:0\":[[\"ghost\"],[]]}");
    PeerTopology p = PeerTopology::from_descriptor(m, devices);
    CHECK_EQ(p.device_count(), size_t(3));
    CHECK_EQ(p.select("cpu:0", 0, 0), 1);  // mlx5_0 is devices[1]
    CHECK_EQ(p.select("cpu:1", 0, 0), 0);  // mlx5_2 is devices[0]
    // retry walk: mlx5_0, mlx5_1, mlx5_2 (ghost dropped), ...
    CHECK_EQ(p.select("cpu:0", 1, 0), 1);
    CHECK_EQ(p.select("cpu:0", 2, 0), 2);
    CHECK_EQ(p.select("cpu:0", 3, 0), 0);
    CHECK_EQ(p.select("cpu:0", 4, 0), 1);
    // cuda:0 only named a ghost: wildcard over devices[].
    CHECK_EQ(p.select("cuda:0", 0, 2), 2);
    // Unknown location: wildcard over devices[] in published order.
    CHECK_EQ(p.select("cpu:7", 0, 0), 0);
    CHECK_EQ(p.select("cpu:7", 2, 0), 1);
    // Paused rails are skipped while an alternative exists.
    auto paused1 = [](int i) { return i == 1; };
    CHECK_EQ(p.select("cpu:0", 0, 0, paused1), 2);  // available mlx5_1 is devices[2]
    CHECK_EQ(p.select("cpu:0", 1, 0, paused1), 2);  // walk on from mlx5_0
    auto all = [](int) { return true; };
    CHECK_EQ(p.select("cpu:0", 0, 0, all), 1);
    // No matrix at all (null): wildcard.
    PeerTopology q = PeerTopology::from_descriptor(Json(), devices);
    CHECK_EQ(q.select("cpu:0", 0, 1), 1);
    // No devices: nothing to select.
    CHECK_EQ(PeerTopology::from_descriptor(m, {}).select("cpu:0", 0, 0), -1);
    // Malformed matrix is a metadata error.
    CHECK(throws_code([&] { PeerTopology::from_descriptor(Json::parse("{\"cpu:0\":[[\"a\"]]}"), devices); },
                      mcrs::kErrMetadata, "priority_matrix"));
    CHECK(throws_code([&] { PeerTopology::from_descriptor(Json::parse("[1]"), devices); },
                      mcrs::kErrMetadata, "JSON object"));
}

TEST(rdma_peer_topology_hostile_sizes) {
    // Many locations and a long device list must neither crash nor blow up.
    Json m = Json::object();
    Json names = Json::array();
    std::vector<std::string> devices;
    for (int i = 0; i < 200; ++i) {
        names.push("d" + std::to_string(i));
        devices.push_back("d" + std::to_string(i));
    }
    for (int i = 0; i < 500; ++i) {
        Json pair = Json::array();
        pair.push(names);
        pair.push(Json::array());
        m.set("cpu:" + std::to_string(i), pair);
    }
    PeerTopology p = PeerTopology::from_descriptor(m, devices);
    CHECK_EQ(p.matrix().device_count(), size_t(200));
    CHECK_EQ(p.select("cpu:499", 0, 199), 199);
    CHECK_EQ(p.select("cpu:499", 1000000, 0), (1000000 - 1) % 200);
}
