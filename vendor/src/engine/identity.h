// Who this engine is, for same-host decisions: this boot of this host, and
// this process, and the address it advertises in centralised metadata.
#pragma once

#include <string>

namespace mcrs {

// "<boot id>@<hostname>"; empty when the boot id cannot be read. Engines
// that agree on it run on one boot of one host.
std::string read_host_id();

// 32 random hex digits made once per process: lets CUDA IPC tell its own
// segments from others' without publishing a pid.
const std::string &process_token();

// Upstream's advertised address: the first IPv4 address of an interface
// that is up and running and not "lo"; empty when there is none.
std::string first_interface_address();

}  // namespace mcrs
