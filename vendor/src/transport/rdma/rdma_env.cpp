#include "transport/rdma/rdma_env.h"

#include <cerrno>
#include <cstdlib>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/rdma/nic_filter.h"

namespace mcrs::rdma {

namespace {

// An integer knob: unset keeps the default silently; unparsable or out of
// range logs a warning and keeps the default (upstream's behaviour).
int64_t knob(const EnvLookup &get, const char *name, int64_t dflt, int64_t lo, int64_t hi) {
    auto v = get(name);
    if (!v) return dflt;
    std::string s = trim(*v);
    if (s.empty()) return dflt;
    errno = 0;
    char *end = nullptr;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || !end || *end != '\0') {
        MC_LOG(Warn, name << "=\"" << *v << "\" is not an integer; using " << dflt);
        return dflt;
    }
    if (x < lo || x > hi) {
        MC_LOG(Warn, name << "=" << x << " is outside [" << lo << ", " << hi << "]; using " << dflt);
        return dflt;
    }
    return x;
}

}  // namespace

RdmaConfig RdmaConfig::from_env(const EnvLookup &lookup) {
    EnvLookup get = lookup ? lookup : EnvLookup([](const char *n) { return env_string(n); });
    RdmaConfig c;
    c.ib_port = static_cast<int>(knob(get, "MC_IB_PORT", 1, 1, 255));
    // The one knob that refuses: see rdma_env.h.
    c.gid_index = parse_gid_index_override(get("MC_GID_INDEX"), get("NCCL_IB_GID_INDEX"));
    c.pkey_index = static_cast<int>(knob(get, "MC_PKEY_INDEX", 0, 0, 65535));
    c.num_qp_per_ep = static_cast<int>(knob(get, "MC_NUM_QP_PER_EP", 2, 1, 255));
    c.max_wr = static_cast<int>(knob(get, "MC_MAX_WR", 256, 1, 65535));
    c.max_sge = static_cast<int>(knob(get, "MC_MAX_SGE", 4, 1, 64));
    c.max_inline = static_cast<int>(knob(get, "MC_MAX_INLINE", 64, 0, 4096));
    int64_t mtu = knob(get, "MC_MTU", 4096, 256, 4096);
    if (mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096) {
        MC_LOG(Warn, "MC_MTU=" << mtu << " is not one of 512, 1024, 2048, 4096; using 4096");
        mtu = 4096;
    }
    c.mtu = static_cast<int>(mtu);
    c.max_cqe_per_ctx = static_cast<int>(knob(get, "MC_MAX_CQE_PER_CTX", 4096, 1, 65535));
    c.max_ep_per_ctx = static_cast<int>(knob(get, "MC_MAX_EP_PER_CTX", 65536, 1, 65535));
    c.slice_size = static_cast<uint64_t>(knob(get, "MC_SLICE_SIZE", 65536, 1, int64_t(1) << 30));
    int64_t ratio = knob(get, "MC_FRAGMENT_RATIO", 4, 1, static_cast<int64_t>(c.slice_size));
    c.fragment_limit = fragment_limit_for(c.slice_size, static_cast<uint64_t>(ratio));
    c.retry_cnt = static_cast<int>(knob(get, "MC_RETRY_CNT", 9, 1, 127));
    c.auto_gid_max_retries = static_cast<int>(knob(get, "MC_AUTO_GID_MAX_RETRIES", 2, 0, 16));
    c.rail_pause_seconds = static_cast<int>(knob(get, "MC_RDMA_RAIL_PAUSE_SECONDS", 30, 1, 3599));
    if (auto v = get("MC_PATH_ROUNDROBIN")) {
        // Upstream: exactly "1" or "true" switch it on. We also accept the
        // other spellings of true; anything that is not a boolean is off.
        auto b = parse_bool(*v);
        if (!b) MC_LOG(Warn, "MC_PATH_ROUNDROBIN=\"" << *v << "\" is not a boolean; round-robin stays off");
        c.path_roundrobin = b.value_or(false);
    }
    c.ib_tc = static_cast<int>(knob(get, "MC_IB_TC", -1, 0, 255));
    c.ib_sl = static_cast<int>(knob(get, "MC_IB_SL", -1, 0, 15));
    if (auto v = get("MC_TE_FILTERS")) c.te_filters = parse_device_list(*v);
    if (auto v = get("MC_CUSTOM_TOPO_JSON")) c.custom_topo_json = trim(*v);
    c.workers_per_ctx = static_cast<int>(knob(get, "MC_WORKERS_PER_CTX", 2, 1, 8));
    c.slice_timeout_s = static_cast<int>(knob(get, "MC_SLICE_TIMEOUT", 0, 0, 65535));  // 0 = off
    return c;
}

void RdmaConfig::validate() const {
    auto fail = [](const std::string &m) { throw Error(kErrInvalidArgument, "RDMA config: " + m); };
    auto range = [&](const char *f, int64_t v, int64_t lo, int64_t hi) {
        if (v < lo || v > hi)
            fail(std::string(f) + "=" + std::to_string(v) + " is outside [" + std::to_string(lo) +
                 ", " + std::to_string(hi) + "]");
    };
    range("ib_port", ib_port, 1, 255);
    range("gid_index", gid_index.index, -1, 255);
    range("pkey_index", pkey_index, 0, 65535);
    range("num_qp_per_ep", num_qp_per_ep, 1, 255);
    range("max_wr", max_wr, 1, 65535);
    range("max_sge", max_sge, 1, 64);
    range("max_inline", max_inline, 0, 4096);
    if (mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096)
        fail("mtu=" + std::to_string(mtu) + " is not one of 512, 1024, 2048, 4096");
    range("max_cqe_per_ctx", max_cqe_per_ctx, 1, 65535);
    range("max_ep_per_ctx", max_ep_per_ctx, 1, 65536);
    range("slice_size", static_cast<int64_t>(slice_size), 1, int64_t(1) << 30);
    range("fragment_limit", static_cast<int64_t>(fragment_limit), 0, static_cast<int64_t>(slice_size));
    range("retry_cnt", retry_cnt, 1, 127);
    range("auto_gid_max_retries", auto_gid_max_retries, 0, 16);
    range("rail_pause_seconds", rail_pause_seconds, 1, 3599);
    range("ib_tc", ib_tc, -1, 255);
    range("ib_sl", ib_sl, -1, 15);
    range("workers_per_ctx", workers_per_ctx, 1, 8);
    range("slice_timeout_s", slice_timeout_s, 0, 65535);
}

}  // namespace mcrs::rdma
