#include "rdma_tmp_dir.h"
#include "test_util.h"
#include "transport/rdma/sysfs_reader.h"

using namespace mcrs::rdma;
using mctest::TmpDir;

namespace {

// A fake /sys: two PCI NICs behind one root port, a GPU next to the first.
struct FakeSys {
    TmpDir d;
    SysfsRoots roots;
    std::string nic0_pci, nic1_pci, gpu_pci;
    FakeSys() {
        nic0_pci = "devices/pci0000:00/0000:00:01.0/0000:3b:00.0";
        nic1_pci = "devices/pci0000:00/0000:00:02.0/0000:5e:00.0";
        gpu_pci = "devices/pci0000:00/0000:00:01.0/0000:3c:00.0";
        d.write(nic0_pci + "/numa_node", "1\n");
        d.write(nic1_pci + "/numa_node", "-1\n");
        d.write(gpu_pci + "/numa_node", "1\n");
        // mlx5_0: class link with a device link (the usual layout).
        d.mkdirs(nic0_pci + "/infiniband/mlx5_0");
        d.symlink(d.at(nic0_pci + "/infiniband/mlx5_0"), "class/infiniband/mlx5_0");
        d.symlink("../../../0000:3b:00.0", nic0_pci + "/infiniband/mlx5_0/device");
        std::string p0 = nic0_pci + "/infiniband/mlx5_0/ports/1";
        d.write(p0 + "/link_layer", "Ethernet\n");
        d.write(p0 + "/gid_attrs/types/0", "IB/RoCE v1\n");
        d.write(p0 + "/gid_attrs/types/1", "RoCE v2\n");
        d.write(p0 + "/gid_attrs/ndevs/0", "eth0\n");
        d.write(p0 + "/gid_attrs/ndevs/1", "eth0\n");
        // mlx5_1: no device link: found through <ibdev>/../..
        d.mkdirs(nic1_pci + "/infiniband/mlx5_1/ports/1");
        d.symlink(d.at(nic1_pci + "/infiniband/mlx5_1"), "class/infiniband/mlx5_1");
        d.write(nic1_pci + "/infiniband/mlx5_1/ports/1/link_layer", "InfiniBand\n");
        d.write(nic1_pci + "/infiniband/mlx5_1/ports/1/gid_attrs/types/0", "IB/RoCE v1\n");
        // Node dir and the PCI bus.
        d.mkdirs("node/node0");
        d.mkdirs("node/node1");
        d.mkdirs("node/node10");
        d.mkdirs("node/nodex");
        d.write("node/possible", "0-1\n");
        d.symlink(d.at(gpu_pci), "bus/pci/devices/0000:3c:00.0");
        d.symlink(d.at(nic0_pci), "bus/pci/devices/0000:3b:00.0");
        d.write("modules", "");
        roots.infiniband = d.at("class/infiniband");
        roots.numa_nodes = d.at("node");
        roots.pci_devices = d.at("bus/pci/devices");
    }
};

}  // namespace

TEST(rdma_sysfs_devices_pci_and_numa) {
    FakeSys s;
    REQUIRE(!s.d.path().empty());
    auto devs = list_ib_devices(s.roots);
    REQUIRE_EQ(devs.size(), size_t(2));
    CHECK_EQ(devs[0], std::string("mlx5_0"));
    CHECK_EQ(devs[1], std::string("mlx5_1"));

    IbDeviceSysfs a = read_ib_device(ib_device_path(s.roots, "mlx5_0"));
    CHECK_EQ(a.pci_path, real_path(s.d.at(s.nic0_pci)));
    CHECK_EQ(a.pci_bus_id, std::string("0000:3b:00.0"));
    CHECK_EQ(a.numa_node, 1);

    IbDeviceSysfs b = read_ib_device(ib_device_path(s.roots, "mlx5_1"));
    CHECK_EQ(b.pci_bus_id, std::string("0000:5e:00.0"));
    CHECK_EQ(b.numa_node, -1);  // the kernel's "unknown"

    IbDeviceSysfs missing = read_ib_device(ib_device_path(s.roots, "mlx5_9"));
    CHECK(missing.pci_path.empty());
    CHECK(missing.pci_bus_id.empty());
    CHECK_EQ(missing.numa_node, -1);
}

TEST(rdma_sysfs_ports_and_gid_attrs) {
    FakeSys s;
    std::string d0 = ib_device_path(s.roots, "mlx5_0");
    std::string d1 = ib_device_path(s.roots, "mlx5_1");
    CHECK(read_port_link_layer(d0, 1) == LinkLayer::RoCE);
    CHECK(read_port_link_layer(d1, 1) == LinkLayer::IB);
    CHECK(read_port_link_layer(d0, 2) == LinkLayer::Unknown);
    CHECK_EQ(read_gid_type_text(d0, 1, 1).value_or("?"), std::string("RoCE v2"));
    CHECK(!read_gid_type_text(d0, 1, 5));
    CHECK(read_gid_type(d0, 1, 0, false) == GidType::RoCEv1);
    CHECK(read_gid_type(d0, 1, 1, false) == GidType::RoCEv2);
    CHECK(read_gid_type(d1, 1, 0, true) == GidType::IB);
    CHECK(read_gid_type(d1, 1, 3, true) == GidType::Unknown);
    CHECK_EQ(read_gid_netdev(d0, 1, 1), std::string("eth0"));
    CHECK_EQ(read_gid_netdev(d1, 1, 0), std::string(""));
}

TEST(rdma_sysfs_numa_nodes_and_gpu_paths) {
    FakeSys s;
    std::vector<int> nodes = list_numa_nodes(s.roots.numa_nodes);
    REQUIRE_EQ(nodes.size(), size_t(3));
    CHECK_EQ(nodes[0], 0);
    CHECK_EQ(nodes[1], 1);
    CHECK_EQ(nodes[2], 10);
    CHECK(list_numa_nodes(s.d.at("nope")).empty());

    // cudaDeviceGetPCIBusId returns upper-case; sysfs names are lower-case.
    CHECK_EQ(gpu_pci_path(s.roots.pci_devices, "0000:3C:00.0"), real_path(s.d.at(s.gpu_pci)));
    CHECK_EQ(gpu_pci_path(s.roots.pci_devices, "0000:99:00.0"), std::string(""));
    CHECK_EQ(gpu_pci_path(s.roots.pci_devices, "../../node"), std::string(""));
    CHECK_EQ(gpu_pci_path(s.roots.pci_devices, ""), std::string(""));
    CHECK_EQ(pci_numa_node(s.roots.pci_devices, "0000:3c:00.0"), 1);
    CHECK_EQ(pci_numa_node(s.roots.pci_devices, "0000:99:00.0"), -1);
}

TEST(rdma_sysfs_small_helpers) {
    struct {
        const char *text;
        int node;
    } numa[] = {{"0", 0}, {"3", 3}, {"-1", -1}, {"", -1}, {"abc", -1}, {"4096", -1}, {"4095", 4095},
                {"1 2", -1}, {"99999999999", -1}};
    for (const auto &c : numa)
        if (parse_numa_node(std::string(c.text)) != c.node)
            mctest::record_failure(__FILE__, __LINE__, std::string("numa_node ") + c.text);
    CHECK_EQ(parse_numa_node(std::nullopt), -1);
    CHECK_EQ(path_basename("/a/b/0000:3b:00.0"), std::string("0000:3b:00.0"));
    CHECK_EQ(path_basename("/a/b/"), std::string("b"));
    CHECK_EQ(path_basename("x"), std::string("x"));
    CHECK_EQ(path_basename("/"), std::string(""));
    CHECK_EQ(normalize_pci_bus_id(" 0000:AF:00.1\n"), std::string("0000:af:00.1"));
    CHECK(is_rw_char_device("/dev/null"));
    TmpDir d;
    d.write("f", "x");
    CHECK(!is_rw_char_device(d.at("f")));
    CHECK(!is_rw_char_device(d.at("missing")));
    // Oversized files are refused rather than read whole.
    d.write("big", std::string(5000, 'a'));
    CHECK(!read_sysfs_text(d.at("big")));
    CHECK_EQ(read_sysfs_text(d.at("big"), 8192).value_or("").size(), size_t(5000));
    CHECK(!read_sysfs_text(d.path()));  // a directory cannot be read
}
