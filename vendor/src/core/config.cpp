// The only file that reads the environment. Every knob is read by one of
// the from_env functions below, with upstream's rules for bad values (a
// warning and the default) unless a comment says otherwise.
#include "core/config.h"

#include <cerrno>
#include <cstdlib>
#include <strings.h>

#include "common/error.h"
#include "common/peer_filter.h"
#include "common/text.h"

namespace mcrs {

namespace {

// Typed reads over one lookup; each warns and keeps the default for a value
// it cannot use, so one bad variable never stops an engine.
class Env {
public:
    explicit Env(const EnvLookup &lookup) : lookup_(lookup) {}

    std::optional<std::string> str(const char *name) const {
        if (lookup_) return lookup_(name);
        const char *v = std::getenv(name);
        if (!v) return std::nullopt;
        return std::string(v);
    }
    bool present(const char *name) const { return str(name).has_value(); }

    // Unset or blank: `dflt` silently; not an integer or outside [lo, hi]:
    // `dflt` with a warning.
    int64_t integer(const char *name, int64_t dflt, int64_t lo, int64_t hi) const {
        auto v = str(name);
        if (!v) return dflt;
        std::string s = trim(*v);
        if (s.empty()) return dflt;
        errno = 0;
        char *end = nullptr;
        long long x = std::strtoll(s.c_str(), &end, 10);
        if (errno != 0 || end == nullptr || *end != '\0') {
            MC_LOG(Warn, name << "=\"" << *v << "\" is not an integer; using " << dflt);
            return dflt;
        }
        if (x < lo || x > hi) {
            MC_LOG(Warn, name << "=" << x << " is outside [" << lo << ", " << hi << "]; using "
                              << dflt);
            return dflt;
        }
        return x;
    }
    uint32_t u32(const char *name, uint32_t dflt, int64_t lo, int64_t hi) const {
        return static_cast<uint32_t>(integer(name, dflt, lo, hi));
    }
    // The first of two spellings that is set (upstream's typo kept as an alias).
    int64_t integer2(const char *name, const char *alias, int64_t dflt, int64_t lo,
                     int64_t hi) const {
        int64_t v = integer(name, -1, lo, hi);
        return v >= 0 ? v : integer(alias, dflt, lo, hi);
    }
    std::vector<std::string> list(const char *name) const {
        auto v = str(name);
        return v ? split_list(*v) : std::vector<std::string>{};
    }

private:
    const EnvLookup &lookup_;
};

// Upstream's port-range rule: bounds below 1024, inside the ephemeral range,
// or an inverted range are rejected as a whole.
void read_port_range(const Env &env, EngineConfig &c) {
    int64_t lo = env.integer2("MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT", 15000, 1, 65535);
    int64_t hi = env.integer2("MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT", 17000, 1, 65535);
    auto bad = [](int64_t p) { return p < 1024 || (p >= 32768 && p <= 60999); };
    if (bad(lo) || bad(hi) || lo > hi) {
        MC_LOG(Warn, "MC_MIN_RPC_PORT/MC_MAX_RPC_PORT range " << lo << ".." << hi
                                                               << " rejected; using 15000..17000");
        lo = 15000;
        hi = 17000;
    }
    c.port_min = static_cast<uint16_t>(lo);
    c.port_max = static_cast<uint16_t>(hi);
}

void read_listener_limits(const Env &env, EngineConfig &c) {
    c.listen_backlog = static_cast<int>(env.integer("MC_HANDSHAKE_LISTEN_BACKLOG", 128, 1, 65535));
    c.handshake_connect_timeout_ms =
        static_cast<uint32_t>(env.integer("MC_HANDSHAKE_CONNECT_TIMEOUT", 5, 1, 3599) * 1000);
    c.handshake_max_length = static_cast<uint64_t>(
        env.integer("MC_HANDSHAKE_MAX_LENGTH", 1 << 20, 1 << 20, int64_t(128) << 20));
    c.handshake_max_connections =
        env.u32("MC_HANDSHAKE_MAX_CONNECTIONS", c.handshake_max_connections, 1, 1 << 20);
    c.handshake_max_connections_per_source =
        env.u32("MC_HANDSHAKE_MAX_CONNECTIONS_PER_SOURCE", c.handshake_max_connections_per_source,
                0, 1 << 20);
    c.tcp_max_server_connections =
        env.u32("MC_TCP_MAX_SERVER_CONNECTIONS", c.tcp_max_server_connections, 1, 1 << 20);
    c.tcp_max_connections_per_source =
        env.u32("MC_TCP_MAX_CONNECTIONS_PER_SOURCE", c.tcp_max_connections_per_source, 0, 1 << 20);
    c.tcp_idle_timeout_ms = env.u32("MC_TCP_IDLE_TIMEOUT_MS", c.tcp_idle_timeout_ms, 1, 3600000);
    c.tcp_pooled_idle_timeout_ms =
        env.u32("MC_TCP_POOLED_IDLE_TIMEOUT_MS", c.tcp_pooled_idle_timeout_ms, 1, 86400000);
    c.tcp_server_workers = env.u32("MC_TCP_SERVER_WORKERS", c.tcp_server_workers, 0, 1024);
    c.notify_max_bytes = static_cast<uint64_t>(env.integer(
        "MC_NOTIFY_MAX_BYTES", static_cast<int64_t>(c.notify_max_bytes), 1, int64_t(1) << 40));
    c.notify_max_message_bytes =
        env.u32("MC_NOTIFY_MAX_MESSAGE_BYTES", c.notify_max_message_bytes, 1, 128 << 20);
    c.allowed_peer_networks = env.list("MC_ALLOWED_PEER_NETWORKS");
}

void read_metadata_settings(const Env &env, EngineConfig &c) {
    if (auto v = env.str("MC_TCP_BIND_ADDRESS")) c.advertise_host = trim(*v);
    if (auto v = env.str("MC_METADATA_CLUSTER_ID")) c.metadata_cluster_id = trim(*v);
    c.metadata_timeout_ms = env.u32("MC_METADATA_TIMEOUT_MS", c.metadata_timeout_ms, 1, 600000);
    c.metadata_lease_ttl_s = env.u32("MC_METADATA_LEASE_TTL_SEC", c.metadata_lease_ttl_s, 0, 86400);
    c.metadata_refresh_interval_s =
        env.u32("MC_TE_METADATA_REFRESH_INTERVAL_SECONDS", c.metadata_refresh_interval_s, 0, 86400);
    c.metadata_cache_ttl_ms = env.u32("MC_METADATA_CACHE_TTL_MS", c.metadata_cache_ttl_ms, 0, 86400000);
    if (auto v = env.str("MC_REDIS_USERNAME")) c.redis_username = *v;
    if (auto v = env.str("MC_REDIS_PASSWORD")) c.redis_password = *v;
    c.redis_db = static_cast<int>(env.integer("MC_REDIS_DB_INDEX", 0, 0, 255));
}

}  // namespace

EngineConfig EngineConfig::from_env(const EnvLookup &lookup) {
    Env env(lookup);
    EngineConfig c;
    read_port_range(env, c);
    read_listener_limits(env, c);
    c.tcp_progress_timeout_ms =
        static_cast<uint32_t>(env.integer("MC_TCP_PROGRESS_TIMEOUT_SEC", 30, 1, 3600) * 1000);
    c.tcp_lanes_per_peer = static_cast<uint32_t>(
        env.integer2("MC_TCP_LANES_PER_PEER", "MC_TCP_MAX_CONNECTIONS_PER_PEER", 4, 1, 16));
    if (env.str("MC_TCP_PROTO") == std::optional<std::string>("1")) c.tcp_proto_version = 1;
    if (env.present("MC_DISABLE_METACACHE")) c.metadata_cache = false;
    if (env.present("MC_DISABLE_SAME_HOST_PATH")) c.enable_same_host = false;
    if (env.present("MC_FORCE_TCP")) c.protocols = kProtoTcp;
    // Ours: restrict the listeners of programs that cannot set bind_address
    // (upstream's createTransferEngine binds every interface).
    c.bind_address = ProcessOverrides::from_env(lookup).bind_address;
    read_metadata_settings(env, c);
    return c;
}

ProcessOverrides ProcessOverrides::from_env(const EnvLookup &lookup) {
    Env env(lookup);
    ProcessOverrides o;
    o.force_tcp = env.present("MC_FORCE_TCP");
    o.force_hca = env.present("MC_FORCE_HCA");
    if (auto b = env.str("MC_BIND_ADDRESS")) o.bind_address = trim(*b);
    o.legacy_rpc_port_binding = env.present("MC_LEGACY_RPC_PORT_BINDING");
    return o;
}

std::string verbs_library_from_env(const EnvLookup &lookup) {
    auto v = Env(lookup).str("MC_VERBS_LIBRARY");
    return v ? trim(*v) : std::string();
}

size_t gpu_stage_chunk_bytes_from_env(const EnvLookup &lookup) {
    return static_cast<size_t>(Env(lookup).integer("MC_GPU_STAGE_CHUNK_KIB", 1024, 64, 16384))
           << 10;
}

bool gpu_stage_kernel_from_env(const EnvLookup &lookup) {
    return Env(lookup).integer("MC_GPU_STAGE_KERNEL", 0, 0, 1) == 1;
}

LogLevel log_level_from_env(const EnvLookup &lookup) {
    auto v = Env(lookup).str("MC_LOG_LEVEL");
    if (!v) return LogLevel::Warn;
    std::string s = trim(*v);
    struct Name {
        const char *text;
        LogLevel level;
    } names[] = {{"TRACE", LogLevel::Trace}, {"DEBUG", LogLevel::Debug},
                 {"INFO", LogLevel::Info},   {"WARN", LogLevel::Warn},
                 {"WARNING", LogLevel::Warn}, {"ERROR", LogLevel::Error}};
    for (const Name &n : names)
        if (strcasecmp(s.c_str(), n.text) == 0) return n.level;
    return LogLevel::Warn;
}

namespace {
// MC_LOG_LEVEL takes effect when the library loads, before any engine
// exists; an embedder's set_log_sink replaces it afterwards.
const bool kLogLevelApplied = (set_log_level(log_level_from_env()), true);
}  // namespace

GpuRegistrationMode resolve_gpu_registration_mode(GpuRegistrationMode m) {
    if (m != GpuRegistrationMode::FromEnv) return m;
    return rdma::with_nvidia_peermem_from_env().value ? GpuRegistrationMode::PeerMem
                                                      : GpuRegistrationMode::DmaBuf;
}

void EngineConfig::validate() const {
    auto fail = [](const std::string &m) { throw Error(kErrInvalidArgument, m); };
    if (metadata_conn_string.empty()) fail("metadata_conn_string is empty");
    if (metadata_timeout_ms == 0 || metadata_timeout_ms > 600000) fail("metadata_timeout_ms must be in 1..600000");
    if (metadata_lease_ttl_s > 86400) fail("metadata_lease_ttl_s must be in 0..86400");
    if (redis_db < 0 || redis_db > 255) fail("redis_db must be in 0..255");
    if (metadata_cluster_id.size() > 256) fail("metadata_cluster_id is longer than 256 bytes");
    if (local_server_name.empty()) fail("local_server_name is empty");
    if (port_min == 0 || port_min > port_max)
        fail("port range " + std::to_string(port_min) + ".." + std::to_string(port_max) +
             " is invalid");
    if (handshake_max_length < 64 || handshake_max_length > (uint64_t(128) << 20))
        fail("handshake_max_length must be in 64..134217728");
    if (handshake_timeout_ms == 0) fail("handshake_timeout_ms must be > 0");
    if (handshake_connect_timeout_ms == 0) fail("handshake_connect_timeout_ms must be > 0");
    if (tcp_connect_timeout_ms == 0) fail("tcp_connect_timeout_ms must be > 0");
    if (tcp_progress_timeout_ms == 0) fail("tcp_progress_timeout_ms must be > 0");
    if (tcp_lanes_per_peer == 0 || tcp_lanes_per_peer > 64)
        fail("tcp_lanes_per_peer must be in 1..64");
    if (tcp_pipeline_depth == 0 || tcp_pipeline_depth > 4096)
        fail("tcp_pipeline_depth must be in 1..4096");
    if (tcp_proto_version != 1 && tcp_proto_version != 2) fail("tcp_proto_version must be 1 or 2");
    if (handshake_max_connections == 0) fail("handshake_max_connections must be > 0");
    if (tcp_max_server_connections == 0) fail("tcp_max_server_connections must be > 0");
    if (tcp_idle_timeout_ms == 0) fail("tcp_idle_timeout_ms must be > 0");
    if (tcp_pooled_idle_timeout_ms == 0) fail("tcp_pooled_idle_timeout_ms must be > 0");
    if (tcp_server_workers > 1024) fail("tcp_server_workers must be in 0..1024");
    if (notify_max_bytes == 0) fail("notify_max_bytes must be > 0");
    if (notify_max_message_bytes == 0) fail("notify_max_message_bytes must be > 0");
    PeerFilter::parse(allowed_peer_networks);  // throws naming the bad entry
    if ((protocols & ~(kProtoTcp | kProtoRdma)) != 0) fail("unknown protocol bits");
    int mode = static_cast<int>(gpu_registration_mode);
    if (mode < 0 || mode > 3) fail("gpu_registration_mode must be 0..3");
}

namespace rdma {

PeermemSetting parse_with_nvidia_peermem(const std::optional<std::string> &raw) {
    PeermemSetting s;
    if (!raw) return s;
    if (auto b = parse_bool(*raw)) {
        s.value = *b;
        return s;
    }
    s.recognized = false;
    s.warning = "WITH_NVIDIA_PEERMEM=\"" + *raw +
                "\" is not a boolean (1/0, true/false, yes/no, on/off, enable/disable); "
                "keeping the default 1 (nvidia-peermem, ibv_reg_mr)";
    return s;
}

PeermemSetting with_nvidia_peermem_from_env(const EnvLookup &lookup) {
    PeermemSetting s = parse_with_nvidia_peermem(Env(lookup).str("WITH_NVIDIA_PEERMEM"));
    if (!s.recognized) MC_LOG(Warn, s.warning);
    return s;
}

namespace {

// -1 = automatic, -2 = not a GID index, else 0..255.
int parse_index_value(const std::string &raw) {
    std::string v = trim(raw);
    if (v.empty() || v == "-1") return -1;
    if (v.size() > 3) return -2;
    int x = 0;
    for (char c : v) {
        if (c < '0' || c > '9') return -2;
        x = x * 10 + (c - '0');
    }
    return x <= 255 ? x : -2;
}

}  // namespace

GidIndexOverride parse_gid_index_override(const std::optional<std::string> &mc,
                                          const std::optional<std::string> &nccl) {
    struct Source {
        const char *name;
        const std::optional<std::string> *value;
    } sources[] = {{"MC_GID_INDEX", &mc}, {"NCCL_IB_GID_INDEX", &nccl}};
    for (const Source &s : sources) {
        if (!*s.value || trim(**s.value).empty()) continue;
        int x = parse_index_value(**s.value);
        if (x == -2)
            throw Error(kErrInvalidArgument,
                        std::string(s.name) + "=\"" + **s.value +
                            "\" is not a GID index: expected an integer in 0..255 (or -1 / "
                            "unset for automatic selection)");
        GidIndexOverride ov;
        ov.index = x;
        if (x >= 0) ov.variable = s.name;
        return ov;  // MC_GID_INDEX=-1 means auto and hides NCCL_IB_GID_INDEX
    }
    return {};
}

uint64_t fragment_limit_for(uint64_t slice_size, uint64_t fragment_ratio) {
    if (fragment_ratio == 0) fragment_ratio = 4;
    return slice_size / fragment_ratio;
}

RdmaConfig RdmaConfig::from_env(const EnvLookup &lookup) {
    Env env(lookup);
    RdmaConfig c;
    auto i = [&](const char *name, int dflt, int64_t lo, int64_t hi) {
        return static_cast<int>(env.integer(name, dflt, lo, hi));
    };
    c.ib_port = i("MC_IB_PORT", 1, 1, 255);
    // The one knob that refuses: see parse_gid_index_override.
    c.gid_index = parse_gid_index_override(env.str("MC_GID_INDEX"), env.str("NCCL_IB_GID_INDEX"));
    c.pkey_index = i("MC_PKEY_INDEX", 0, 0, 65535);
    c.num_qp_per_ep = i("MC_NUM_QP_PER_EP", 2, 1, 255);
    c.max_wr = i("MC_MAX_WR", 256, 1, 65535);
    c.max_sge = i("MC_MAX_SGE", 4, 1, 64);
    c.max_inline = i("MC_MAX_INLINE", 64, 0, 4096);
    c.mtu = i("MC_MTU", 4096, 256, 4096);
    if (c.mtu != 512 && c.mtu != 1024 && c.mtu != 2048 && c.mtu != 4096) {
        MC_LOG(Warn, "MC_MTU=" << c.mtu << " is not one of 512, 1024, 2048, 4096; using 4096");
        c.mtu = 4096;
    }
    c.max_cqe_per_ctx = i("MC_MAX_CQE_PER_CTX", 4096, 1, 65535);
    c.max_ep_per_ctx = i("MC_MAX_EP_PER_CTX", 65536, 1, 65535);
    c.slice_size = static_cast<uint64_t>(env.integer("MC_SLICE_SIZE", 65536, 1, int64_t(1) << 30));
    int64_t ratio = env.integer("MC_FRAGMENT_RATIO", 4, 1, static_cast<int64_t>(c.slice_size));
    c.fragment_limit = fragment_limit_for(c.slice_size, static_cast<uint64_t>(ratio));
    c.retry_cnt = i("MC_RETRY_CNT", 9, 1, 127);
    c.auto_gid_max_retries = i("MC_AUTO_GID_MAX_RETRIES", 2, 0, 16);
    c.rail_pause_seconds = i("MC_RDMA_RAIL_PAUSE_SECONDS", 30, 1, 3599);
    if (auto v = env.str("MC_PATH_ROUNDROBIN")) {
        // Upstream: exactly "1" or "true" switch it on. We also accept the
        // other spellings of true; anything that is not a boolean is off.
        auto b = parse_bool(*v);
        if (!b) MC_LOG(Warn, "MC_PATH_ROUNDROBIN=\"" << *v << "\" is not a boolean; round-robin stays off");
        c.path_roundrobin = b.value_or(false);
    }
    c.ib_tc = i("MC_IB_TC", -1, 0, 255);
    c.ib_sl = i("MC_IB_SL", -1, 0, 15);
    c.te_filters = env.list("MC_TE_FILTERS");
    if (auto v = env.str("MC_CUSTOM_TOPO_JSON")) c.custom_topo_json = trim(*v);
    c.workers_per_ctx = i("MC_WORKERS_PER_CTX", 2, 1, 8);
    c.slice_timeout_s = i("MC_SLICE_TIMEOUT", 0, 0, 65535);  // 0 = off
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

}  // namespace rdma
}  // namespace mcrs
