// The fake sysfs tree of softverbs: the same relative layout as /sys, so
// topology code reads the same files on real hardware and on the stand-in
// (layout in softverbs_control.h).
#pragma once

#include <string>
#include <vector>

#include "sv_state.h"

namespace sv {

// Picks the root ($MC_SOFTVERBS_SYSFS or a new mkdtemp dir) if not chosen
// yet, writes every device's tree and fills ibdev_path/dev_path. Returns
// an empty string or the reason it failed.
std::string build_sysfs(Registry &reg, std::vector<std::unique_ptr<Device>> &devices);
// Removes what build_sysfs created (and the root if it made it).
void remove_sysfs(Registry &reg);
// Rewrites ports/1/state after a port state change.
void write_port_state(const Device &dev);

}  // namespace sv
