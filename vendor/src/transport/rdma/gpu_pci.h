// Where the GPUs sit on the PCI tree, for the "cuda:<ordinal>" entries of the
// priority matrix (docs/wire-protocol.md, RDMA priority matrix): the driver's
// bus ids in the form sysfs uses, resolved against a sysfs root (injectable,
// like the NICs' paths).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "transport/rdma/sysfs_reader.h"
#include "transport/rdma/topology.h"

namespace mcrs::rdma {

// "[domain]:bus:device.function" (hex, any case, surrounding blanks
// allowed; the driver pads the domain to 4 or 8 digits, a missing domain is
// 0) -> sysfs form, lower case, domain at least 4 digits: "00000000:3B:00.0"
// -> "0000:3b:00.0". nullopt for anything else (bus > ff, device > 1f,
// function > 7, domain > ffffffff, stray characters).
std::optional<std::string> canonical_pci_bus_id(const std::string &raw);

// One GpuInfo per id, ordinal = position. pci_path = realpath of
// <roots.pci_devices>/<canonical id>, numa_node from <pci_path>/numa_node;
// an id that does not parse or resolve keeps pci_path "" and numa -1 (its
// entry then prefers every NIC).
std::vector<GpuInfo> gpus_from_bus_ids(const std::vector<std::string> &bus_ids,
                                       const SysfsRoots &roots);

// The CUDA driver's GPUs (gpu::driver_pci_bus_ids) resolved against
// `roots`. Empty, with a debug log, when there is no driver or no GPU, and in
// CPU builds: RDMA discovery never fails for want of GPUs.
std::vector<GpuInfo> list_cuda_gpus(const SysfsRoots &roots = SysfsRoots());

}  // namespace mcrs::rdma
