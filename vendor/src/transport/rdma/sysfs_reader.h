// Reading the sysfs facts the RDMA topology needs. Every root is a parameter
// so tests point them at temporary directories. A missing or unreadable file
// is never an error: the reader returns "unknown" (empty string, -1,
// nullopt) and the caller decides.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "transport/rdma/gid.h"
#include "transport/rdma/link_layer.h"

namespace mcrs::rdma {

struct SysfsRoots {
    std::string infiniband = "/sys/class/infiniband";   // <dev> -> ibdev_path
    std::string numa_nodes = "/sys/devices/system/node";  // nodeN
    std::string pci_devices = "/sys/bus/pci/devices";     // <bus id>
    std::string modules = "/sys/module";                  // nvidia_peermem
    std::string proc_modules = "/proc/modules";
};

// Contents of a small text file with surrounding whitespace trimmed; nullopt
// when it cannot be opened or read (sysfs answers EINVAL for empty GID slots)
// or is larger than `max_bytes`.
std::optional<std::string> read_sysfs_text(const std::string &path, size_t max_bytes = 4096);
// realpath(3), or "" when the path does not resolve.
std::string real_path(const std::string &path);
// Last non-empty component ("a/b/" -> "b").
std::string path_basename(const std::string &path);
// Lower-cased and trimmed ("0000:3B:00.0" -> "0000:3b:00.0").
std::string normalize_pci_bus_id(const std::string &bus_id);

std::string ib_device_path(const SysfsRoots &roots, const std::string &device);
// Entries of the infiniband class directory, sorted by name.
std::vector<std::string> list_ib_devices(const SysfsRoots &roots);

struct IbDeviceSysfs {
    std::string pci_path;    // realpath of <ibdev_path>/device; "" unknown
    std::string pci_bus_id;  // basename of pci_path (lower-case); "" unknown
    int numa_node = -1;      // <pci_path>/numa_node; -1 unknown
};
// When <ibdev_path>/device is missing, falls back to realpath of
// <ibdev_path>/../.. (the PCI function above .../infiniband/<dev>).
IbDeviceSysfs read_ib_device(const std::string &ibdev_path);
// numa_node file content: an integer 0..4095, else -1 (the kernel writes -1
// when the platform does not say).
int parse_numa_node(const std::optional<std::string> &text);

// ports/<port>/link_layer.
LinkLayer read_port_link_layer(const std::string &ibdev_path, int port);
// ports/<port>/gid_attrs/types/<index>, e.g. "RoCE v2", "IB/RoCE v1".
std::optional<std::string> read_gid_type_text(const std::string &ibdev_path, int port, int index);
GidType read_gid_type(const std::string &ibdev_path, int port, int index, bool port_is_ib);
// ports/<port>/gid_attrs/ndevs/<index>; "" when absent.
std::string read_gid_netdev(const std::string &ibdev_path, int port, int index);

// N of every entry named "node<N>" in `nodes_dir`, sorted ascending.
std::vector<int> list_numa_nodes(const std::string &nodes_dir);
// realpath of <pci_root>/<bus id lower-cased>, "" when absent.
std::string gpu_pci_path(const std::string &pci_root, const std::string &bus_id);
// <pci_root>/<bus id>/numa_node, -1 unknown.
int pci_numa_node(const std::string &pci_root, const std::string &bus_id);

// True when `path` is a character device this process may read and write
// (the check NIC discovery applies to the device's uverbs node;
// docs/wire-protocol.md, RDMA priority matrix).
bool is_rw_char_device(const std::string &path);

}  // namespace mcrs::rdma
