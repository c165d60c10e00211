#include "transport/rdma/gpu_pci.h"

#include <cctype>
#include <cstdio>

#include "common/text.h"
#include "common/log.h"
#include "gpu/gpu.h"

namespace mcrs::rdma {

namespace {

// Hex digits [b, e) of `s` as a number; false when empty, too long or not hex.
bool hex_field(const std::string &s, size_t b, size_t e, size_t max_digits, unsigned long &out) {
    if (e <= b || e - b > max_digits) return false;
    out = 0;
    for (size_t i = b; i < e; ++i) {
        int c = std::tolower(static_cast<unsigned char>(s[i]));
        int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (v < 0) return false;
        out = out * 16 + static_cast<unsigned long>(v);
    }
    return true;
}

}  // namespace

std::optional<std::string> canonical_pci_bus_id(const std::string &raw) {
    std::string s = trim(raw);
    size_t dot = s.rfind('.');
    size_t c2 = s.rfind(':', dot == std::string::npos ? std::string::npos : dot);
    if (dot == std::string::npos || c2 == std::string::npos) return std::nullopt;
    size_t c1 = c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
    unsigned long dom = 0, bus = 0, dev = 0, fn = 0;
    if (c1 != std::string::npos && !hex_field(s, 0, c1, 8, dom)) return std::nullopt;
    size_t bus_b = c1 == std::string::npos ? 0 : c1 + 1;
    if (!hex_field(s, bus_b, c2, 2, bus) || !hex_field(s, c2 + 1, dot, 2, dev) ||
        !hex_field(s, dot + 1, s.size(), 1, fn))
        return std::nullopt;
    if (dev > 0x1f || fn > 7) return std::nullopt;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04lx:%02lx:%02lx.%lx", dom, bus, dev, fn);
    return std::string(buf);
}

std::vector<GpuInfo> gpus_from_bus_ids(const std::vector<std::string> &bus_ids,
                                       const SysfsRoots &roots) {
    std::vector<GpuInfo> out;
    for (size_t i = 0; i < bus_ids.size(); ++i) {
        GpuInfo g;
        g.ordinal = static_cast<int>(i);
        auto id = canonical_pci_bus_id(bus_ids[i]);
        g.pci_bus_id = id ? *id : normalize_pci_bus_id(bus_ids[i]);
        if (id) g.pci_path = gpu_pci_path(roots.pci_devices, *id);
        if (!g.pci_path.empty())
            g.numa_node = parse_numa_node(read_sysfs_text(g.pci_path + "/numa_node"));
        else
            MC_LOG(Debug, "GPU " << i << " (PCI bus id \"" << bus_ids[i] << "\") not found under "
                                 << roots.pci_devices << "; its NIC preference uses no PCI distance");
        out.push_back(std::move(g));
    }
    return out;
}

std::vector<GpuInfo> list_cuda_gpus(const SysfsRoots &roots) {
    std::vector<std::string> ids;
    std::string err;
    if (!gpu::driver_pci_bus_ids(ids, err)) {
        MC_LOG(Debug, "RDMA topology without GPU entries: " << err);
        return {};
    }
    return gpus_from_bus_ids(ids, roots);
}

}  // namespace mcrs::rdma
