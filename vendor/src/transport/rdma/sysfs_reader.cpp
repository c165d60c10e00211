#include "transport/rdma/sysfs_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "common/text.h"

namespace mcrs::rdma {

std::optional<std::string> read_sysfs_text(const std::string &path, size_t max_bytes) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    std::string out;
    char buf[512];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            ::close(fd);
            return std::nullopt;
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
        if (out.size() > max_bytes) {
            ::close(fd);
            return std::nullopt;
        }
    }
    ::close(fd);
    return trim(out);
}

std::string real_path(const std::string &path) {
    char buf[PATH_MAX];
    if (!::realpath(path.c_str(), buf)) return "";
    return buf;
}

std::string path_basename(const std::string &path) {
    size_t end = path.size();
    while (end > 0 && path[end - 1] == '/') --end;
    size_t b = path.rfind('/', end == 0 ? 0 : end - 1);
    b = (b == std::string::npos) ? 0 : b + 1;
    return end > b ? path.substr(b, end - b) : "";
}

std::string normalize_pci_bus_id(const std::string &bus_id) {
    std::string s = trim(bus_id);
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
}

std::string ib_device_path(const SysfsRoots &roots, const std::string &device) {
    return roots.infiniband + "/" + device;
}

namespace {

std::vector<std::string> list_dir(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = ::opendir(dir.c_str());
    if (!d) return out;
    while (struct dirent *e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        out.push_back(n);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

std::string port_dir(const std::string &ibdev_path, int port) {
    return ibdev_path + "/ports/" + std::to_string(port);
}

}  // namespace

std::vector<std::string> list_ib_devices(const SysfsRoots &roots) {
    return list_dir(roots.infiniband);
}

int parse_numa_node(const std::optional<std::string> &text) {
    if (!text || text->empty() || text->size() > 4) return -1;
    int x = 0;
    for (char c : *text) {
        if (c < '0' || c > '9') return -1;
        x = x * 10 + (c - '0');
    }
    return x <= 4095 ? x : -1;
}

IbDeviceSysfs read_ib_device(const std::string &ibdev_path) {
    IbDeviceSysfs out;
    out.pci_path = real_path(ibdev_path + "/device");
    if (out.pci_path.empty()) out.pci_path = real_path(ibdev_path + "/../..");
    if (out.pci_path.empty()) return out;
    out.pci_bus_id = normalize_pci_bus_id(path_basename(out.pci_path));
    out.numa_node = parse_numa_node(read_sysfs_text(out.pci_path + "/numa_node"));
    return out;
}

LinkLayer read_port_link_layer(const std::string &ibdev_path, int port) {
    auto t = read_sysfs_text(port_dir(ibdev_path, port) + "/link_layer");
    return t ? parse_link_layer(*t) : LinkLayer::Unknown;
}

std::optional<std::string> read_gid_type_text(const std::string &ibdev_path, int port, int index) {
    return read_sysfs_text(port_dir(ibdev_path, port) + "/gid_attrs/types/" +
                           std::to_string(index));
}

GidType read_gid_type(const std::string &ibdev_path, int port, int index, bool port_is_ib) {
    auto t = read_gid_type_text(ibdev_path, port, index);
    return t ? gid_type_from_sysfs(*t, port_is_ib) : GidType::Unknown;
}

std::string read_gid_netdev(const std::string &ibdev_path, int port, int index) {
    auto t = read_sysfs_text(port_dir(ibdev_path, port) + "/gid_attrs/ndevs/" +
                             std::to_string(index));
    return t ? *t : "";
}

std::vector<int> list_numa_nodes(const std::string &nodes_dir) {
    std::vector<int> out;
    for (const std::string &n : list_dir(nodes_dir)) {
        if (n.size() < 5 || n.size() > 8 || n.compare(0, 4, "node") != 0) continue;
        int v = parse_numa_node(n.substr(4));
        if (v >= 0) out.push_back(v);
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::string gpu_pci_path(const std::string &pci_root, const std::string &bus_id) {
    std::string id = normalize_pci_bus_id(bus_id);
    if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..") return "";
    return real_path(pci_root + "/" + id);
}

int pci_numa_node(const std::string &pci_root, const std::string &bus_id) {
    std::string p = gpu_pci_path(pci_root, bus_id);
    if (p.empty()) return -1;
    return parse_numa_node(read_sysfs_text(p + "/numa_node"));
}

bool is_rw_char_device(const std::string &path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return false;
    return ::access(path.c_str(), R_OK | W_OK) == 0;
}

}  // namespace mcrs::rdma
