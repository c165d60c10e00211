#include "core/config.h"

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/peer_filter.h"

namespace mcrs {

std::vector<std::string> split_list(const std::string &s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == ',' || c == ';') {
            std::string t = trim(cur);
            if (!t.empty()) out.push_back(t);
            cur.clear();
        } else {
            cur.push_back(c);
        }
    }
    std::string t = trim(cur);
    if (!t.empty()) out.push_back(t);
    return out;
}

EngineConfig EngineConfig::from_env() {
    EngineConfig c;
    int64_t lo = env_int("MC_MIN_RPC_PORT", -1, 1, 65535);
    if (lo < 0) lo = env_int("MC_MIN_PRC_PORT", 15000, 1, 65535);
    int64_t hi = env_int("MC_MAX_RPC_PORT", -1, 1, 65535);
    if (hi < 0) hi = env_int("MC_MAX_PRC_PORT", 17000, 1, 65535);
    // Upstream's rule: reject bounds below 1024, inside the ephemeral range,
    // or an inverted range.
    auto bad = [](int64_t p) { return p < 1024 || (p >= 32768 && p <= 60999); };
    if (bad(lo) || bad(hi) || lo > hi) {
        MC_LOG(Warn, "MC_MIN_RPC_PORT/MC_MAX_RPC_PORT range " << lo << ".." << hi
                                                               << " rejected; using 15000..17000");
        lo = 15000;
        hi = 17000;
    }
    c.port_min = static_cast<uint16_t>(lo);
    c.port_max = static_cast<uint16_t>(hi);
    c.listen_backlog = static_cast<int>(env_int("MC_HANDSHAKE_LISTEN_BACKLOG", 128, 1, 65535));
    c.handshake_connect_timeout_ms =
        static_cast<uint32_t>(env_int("MC_HANDSHAKE_CONNECT_TIMEOUT", 5, 1, 3599) * 1000);
    c.handshake_max_length = static_cast<uint64_t>(
        env_int("MC_HANDSHAKE_MAX_LENGTH", 1 << 20, 1 << 20, int64_t(128) << 20));
    c.tcp_progress_timeout_ms =
        static_cast<uint32_t>(env_int("MC_TCP_PROGRESS_TIMEOUT_SEC", 30, 1, 3600) * 1000);
    int64_t lanes = env_int("MC_TCP_LANES_PER_PEER", -1, 1, 16);
    if (lanes < 0) lanes = env_int("MC_TCP_MAX_CONNECTIONS_PER_PEER", 4, 1, 16);
    c.tcp_lanes_per_peer = static_cast<uint32_t>(lanes);
    if (auto p = env_string("MC_TCP_PROTO"); p && *p == "1") c.tcp_proto_version = 1;
    if (env_present("MC_DISABLE_METACACHE")) c.metadata_cache = false;
    if (env_present("MC_DISABLE_SAME_HOST_PATH")) c.enable_same_host = false;
    if (auto f = env_string("MC_TE_FILTERS")) c.device_allow_list = split_list(*f);
    if (env_present("MC_FORCE_TCP")) c.protocols = kProtoTcp;
    auto u32 = [](const char *name, uint32_t def, int64_t min, int64_t max) {
        return static_cast<uint32_t>(env_int(name, def, min, max));
    };
    c.tcp_max_server_connections =
        u32("MC_TCP_MAX_SERVER_CONNECTIONS", c.tcp_max_server_connections, 1, 1 << 20);
    c.tcp_max_connections_per_source =
        u32("MC_TCP_MAX_CONNECTIONS_PER_SOURCE", c.tcp_max_connections_per_source, 0, 1 << 20);
    c.tcp_idle_timeout_ms = u32("MC_TCP_IDLE_TIMEOUT_MS", c.tcp_idle_timeout_ms, 1, 3600000);
    c.tcp_pooled_idle_timeout_ms =
        u32("MC_TCP_POOLED_IDLE_TIMEOUT_MS", c.tcp_pooled_idle_timeout_ms, 1, 86400000);
    c.tcp_server_workers = u32("MC_TCP_SERVER_WORKERS", c.tcp_server_workers, 0, 1024);
    c.handshake_max_connections =
        u32("MC_HANDSHAKE_MAX_CONNECTIONS", c.handshake_max_connections, 1, 1 << 20);
    c.handshake_max_connections_per_source = u32("MC_HANDSHAKE_MAX_CONNECTIONS_PER_SOURCE",
                                                 c.handshake_max_connections_per_source, 0, 1 << 20);
    c.notify_max_bytes = static_cast<uint64_t>(
        env_int("MC_NOTIFY_MAX_BYTES", static_cast<int64_t>(c.notify_max_bytes), 1,
                int64_t(1) << 40));
    c.notify_max_message_bytes =
        u32("MC_NOTIFY_MAX_MESSAGE_BYTES", c.notify_max_message_bytes, 1, 128 << 20);
    if (auto a = env_string("MC_ALLOWED_PEER_NETWORKS")) c.allowed_peer_networks = split_list(*a);
    // Ours: restrict the listeners of programs that cannot set bind_address
    // (upstream's createTransferEngine binds every interface).
    if (auto b = env_string("MC_BIND_ADDRESS"); b && !b->empty()) c.bind_address = *b;
    return c;
}

GpuRegistrationMode resolve_gpu_registration_mode(GpuRegistrationMode m) {
    if (m != GpuRegistrationMode::FromEnv) return m;
    // Upstream's rule: WITH_NVIDIA_PEERMEM defaults to true; values it cannot
    // parse keep the default.
    return env_bool("WITH_NVIDIA_PEERMEM", true) ? GpuRegistrationMode::PeerMem
                                                 : GpuRegistrationMode::DmaBuf;
}

void EngineConfig::validate() const {
    auto fail = [](const std::string &m) { throw Error(kErrInvalidArgument, m); };
    if (metadata_conn_string.empty()) fail("metadata_conn_string is empty");
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

}  // namespace mcrs
