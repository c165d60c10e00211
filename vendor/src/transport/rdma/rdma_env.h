// The RDMA transport's knobs (docs/wire-protocol.md, Limits and knobs), read
// once from the environment. Policy on bad values, per knob in rdma_env.cpp: upstream's
// "warning + default" for every tuning knob, a thrown Error for MC_GID_INDEX
// / NCCL_IB_GID_INDEX (a silently wrong GID index selects the wrong RoCE
// version, which only shows up as an RTR failure much later).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "transport/rdma/gid.h"
#include "transport/rdma/slicer.h"

namespace mcrs::rdma {

using EnvLookup = std::function<std::optional<std::string>(const char *)>;

struct RdmaConfig {
    int ib_port = 1;                     // MC_IB_PORT 1..255
    GidIndexOverride gid_index;          // MC_GID_INDEX / NCCL_IB_GID_INDEX, -1 auto
    int pkey_index = 0;                  // MC_PKEY_INDEX 0..65535
    int num_qp_per_ep = 2;               // MC_NUM_QP_PER_EP 1..255 (must match the peer)
    int max_wr = 256;                    // MC_MAX_WR 1..65535
    int max_sge = 4;                     // MC_MAX_SGE 1..64
    int max_inline = 64;                 // MC_MAX_INLINE 0..4096
    int mtu = 4096;                      // MC_MTU 512/1024/2048/4096
    int max_cqe_per_ctx = 4096;          // MC_MAX_CQE_PER_CTX 1..65535
    int max_ep_per_ctx = 65536;          // MC_MAX_EP_PER_CTX 1..65535 (default 65536)
    uint64_t slice_size = 65536;         // MC_SLICE_SIZE 1..1 GiB
    uint64_t fragment_limit = 16384;     // slice_size / MC_FRAGMENT_RATIO (1..slice_size), default /4
    int retry_cnt = 9;                   // MC_RETRY_CNT 1..127
    int auto_gid_max_retries = 2;        // MC_AUTO_GID_MAX_RETRIES 0..16
    int rail_pause_seconds = 30;         // MC_RDMA_RAIL_PAUSE_SECONDS 1..3599
    bool path_roundrobin = false;        // MC_PATH_ROUNDROBIN
    int ib_tc = -1;                      // MC_IB_TC 0..255, -1 = not set
    int ib_sl = -1;                      // MC_IB_SL 0..15, -1 = not set (0 is used)
    std::vector<std::string> te_filters; // MC_TE_FILTERS
    std::string custom_topo_json;        // MC_CUSTOM_TOPO_JSON (a file path)
    int workers_per_ctx = 2;             // MC_WORKERS_PER_CTX 1..8
    int slice_timeout_s = 0;             // MC_SLICE_TIMEOUT 1..65535 s; 0 (or unset) = off

    // Defaults overlaid with the environment (or `lookup`, for tests). Logs a
    // warning per ignored value; throws Error(kErrInvalidArgument) only for a
    // bad GID index.
    static RdmaConfig from_env(const EnvLookup &lookup = {});
    // For configs built in code: Error(kErrInvalidArgument) naming the field.
    void validate() const;

    SliceParams slice_params() const { return {slice_size, fragment_limit}; }
    int sl() const { return ib_sl < 0 ? 0 : ib_sl; }
};

}  // namespace mcrs::rdma
