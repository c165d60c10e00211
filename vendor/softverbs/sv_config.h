// The device set of softverbs, parsed from the MC_SOFTVERBS_DEVICES spec
// (format in softverbs_control.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sv {

struct DeviceSpec {
    std::string name;
    bool roce = false;
    int numa = 0;
    std::string pci;      // e.g. 0000:10:00.0
    std::string bridge;   // upstream port the function sits behind; "" = the root
    int gids = 0;         // populated GID entries
    std::string netdev;   // RoCE only
    uint32_t ipv4 = 0;    // host order, RoCE only
    int active_mtu = 0;   // enum ibv_mtu value
    bool port_up = true;
    int max_qp = 262144;
    int max_cqe = 4194303;
    int max_qp_wr = 32768;
    int max_sge = 30;
    uint64_t max_mr_size = ~0ull;
};

constexpr const char *kDefaultSpec = "sv0:roce,sv1:roce";
constexpr int kGidTableLen = 16;

// Parses `spec`; on error returns false with `err` set.
bool parse_spec(const std::string &spec, std::vector<DeviceSpec> &out, std::string &err);

}  // namespace sv
