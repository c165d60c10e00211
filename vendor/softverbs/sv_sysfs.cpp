#include "sv_sysfs.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace sv {

namespace fs = std::filesystem;

namespace {

void write_file(const fs::path &p, const std::string &text) {
    std::ofstream out(p);
    out << text << "\n";
    if (!out) throw std::runtime_error("cannot write " + p.string());
}

std::string gid_type_text(const Device &d, size_t i) {
    return d.gids[i].roce_v2 ? "RoCE v2" : "IB/RoCE v1";
}

std::string port_state_text(int state) {
    return state == ibv::IBV_PORT_ACTIVE ? "4: ACTIVE" : "1: DOWN";
}

void copy_path(char *dst, const std::string &src) {
    if (src.size() >= ibv::IBV_SYSFS_PATH_MAX)
        throw std::runtime_error("sysfs path too long: " + src);
    std::memcpy(dst, src.c_str(), src.size() + 1);
}

void build_device(const fs::path &root, Device &d) {
    // Behind a bridge: devices/pci0000:00/<bridge>/<pci>, like a NIC behind
    // a PCIe switch port (what the GPU-to-NIC PCI distance looks at).
    const std::string rel_pci =
        "devices/pci0000:00/" + (d.spec.bridge.empty() ? "" : d.spec.bridge + "/") + d.spec.pci;
    const fs::path pci_dir = root / rel_pci;
    const fs::path ib_dir = pci_dir / "infiniband" / d.spec.name;
    const std::string uverbs = "uverbs" + std::to_string(d.index);
    const fs::path verbs_dir = pci_dir / "infiniband_verbs" / uverbs;
    const fs::path port = ib_dir / "ports" / "1";
    fs::create_directories(port / "gid_attrs" / "types");
    fs::create_directories(port / "gid_attrs" / "ndevs");
    fs::create_directories(verbs_dir);
    write_file(pci_dir / "numa_node", std::to_string(d.spec.numa));
    write_file(pci_dir / "vendor", "0x15b3");
    write_file(pci_dir / "device", "0x5356");  // a file here; ib_dir/device is the link
    fs::create_directory_symlink("../../../" + d.spec.pci, ib_dir / "device");
    write_file(port / "link_layer", d.spec.roce ? "Ethernet" : "InfiniBand");
    write_file(port / "state", port_state_text(d.port_state));
    for (size_t i = 0; i < d.gids.size(); ++i) {
        write_file(port / "gid_attrs" / "types" / std::to_string(i), gid_type_text(d, i));
        if (d.spec.roce) write_file(port / "gid_attrs" / "ndevs" / std::to_string(i), d.spec.netdev);
    }
    write_file(verbs_dir / "ibdev", d.spec.name);
    fs::create_directories(root / "class" / "infiniband");
    fs::create_directories(root / "class" / "infiniband_verbs");
    fs::create_directories(root / "bus" / "pci" / "devices");
    fs::create_directory_symlink("../../" + rel_pci + "/infiniband/" + d.spec.name,
                                 root / "class" / "infiniband" / d.spec.name);
    fs::create_directory_symlink("../../" + rel_pci + "/infiniband_verbs/" + uverbs,
                                 root / "class" / "infiniband_verbs" / uverbs);
    fs::path bus_link = root / "bus" / "pci" / "devices" / d.spec.pci;
    if (!fs::exists(fs::symlink_status(bus_link)))
        fs::create_directory_symlink("../../../" + rel_pci, bus_link);
    d.ibdev_dir = ib_dir.string();
    copy_path(d.h.abi.ibdev_path, (root / "class" / "infiniband" / d.spec.name).string());
    copy_path(d.h.abi.dev_path, (root / "class" / "infiniband_verbs" / uverbs).string());
    std::snprintf(d.h.abi.dev_name, sizeof(d.h.abi.dev_name), "%s", uverbs.c_str());
}

}  // namespace

std::string build_sysfs(Registry &reg, std::vector<std::unique_ptr<Device>> &devices) {
    try {
        if (reg.sysfs_root.empty()) {
            const char *env = std::getenv("MC_SOFTVERBS_SYSFS");
            if (env && *env) {
                reg.sysfs_root_created = !fs::exists(env);
                fs::create_directories(env);
                reg.sysfs_root = fs::absolute(env).string();
            } else {
                const char *tmp = std::getenv("TMPDIR");
                std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/mc_softverbs.XXXXXX";
                std::vector<char> buf(templ.begin(), templ.end());
                buf.push_back('\0');
                if (!mkdtemp(buf.data())) return "mkdtemp " + templ + ": " + std::strerror(errno);
                reg.sysfs_root = buf.data();
                reg.sysfs_root_created = true;
            }
        }
        for (auto &d : devices) build_device(reg.sysfs_root, *d);
    } catch (const std::exception &e) {
        return e.what();
    }
    return "";
}

void remove_sysfs(Registry &reg) {
    if (reg.sysfs_root.empty()) return;
    std::error_code ec;
    if (reg.sysfs_root_created) {
        fs::remove_all(reg.sysfs_root, ec);
    } else {
        for (const char *sub : {"devices", "class", "bus"}) fs::remove_all(fs::path(reg.sysfs_root) / sub, ec);
    }
    reg.sysfs_root.clear();
    reg.sysfs_root_created = false;
}

void write_port_state(const Device &dev) {
    if (dev.ibdev_dir.empty()) return;
    std::ofstream out(fs::path(dev.ibdev_dir) / "ports" / "1" / "state");
    out << port_state_text(dev.port_state) << "\n";
}

}  // namespace sv
