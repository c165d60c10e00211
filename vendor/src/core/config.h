// The engine's whole typed configuration, and the one place (config.cpp)
// that reads it from the environment: per-engine settings (EngineConfig), the
// RDMA transport's knobs (rdma::RdmaConfig), and the few process-wide ones.
// Upstream reads process-wide env vars where it needs them; here each engine
// carries its own copy, built from the env vars by default so that vLLM-style
// deployments keep their behaviour. Adding a knob: a field here, its line in
// config.cpp, its row in the README's environment table, and its use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"

namespace mcrs {

// Where settings come from: the process environment when empty, a map in tests.
using EnvLookup = std::function<std::optional<std::string>(const char *)>;

enum ProtocolMask : uint32_t {
    kProtoTcp = 1u << 0,
    kProtoRdma = 1u << 1,
};

enum class GpuRegistrationMode : int { FromEnv = 0, PeerMem = 1, DmaBuf = 2, Auto = 3 };

struct EngineConfig {
    std::string metadata_conn_string = "P2PHANDSHAKE";
    std::string local_server_name = "127.0.0.1";
    // Address the listeners bind to; empty = wildcard (upstream's behaviour).
    // Env MC_BIND_ADDRESS (ours) sets it for programs that cannot.
    std::string bind_address;
    uint32_t protocols = kProtoTcp;

    uint16_t rpc_port = 0;       // 0 = random in [port_min, port_max]
    uint16_t tcp_data_port = 0;  // 0 = random in [port_min, port_max]
    uint16_t port_min = 15000;
    uint16_t port_max = 17000;
    int listen_backlog = 128;

    std::vector<std::string> device_allow_list;
    std::vector<std::string> device_deny_list;
    GpuRegistrationMode gpu_registration_mode = GpuRegistrationMode::FromEnv;

    uint32_t handshake_connect_timeout_ms = 5000;
    uint32_t handshake_timeout_ms = 10000;  // whole request/reply exchange
    uint64_t handshake_max_length = 1u << 20;
    uint32_t handshake_max_connections = 256;
    // 0 = max(8, handshake_max_connections / 8).
    uint32_t handshake_max_connections_per_source = 0;
    // RDMA ready-ACK wait (docs/wire-protocol.md, RDMA endpoint handshake);
    // settable for tests only.
    uint32_t rdma_ready_ack_timeout_ms = 10000;

    uint32_t tcp_connect_timeout_ms = 5000;
    uint32_t tcp_progress_timeout_ms = 30000;
    uint32_t tcp_lanes_per_peer = 4;
    uint32_t tcp_pipeline_depth = 64;
    uint32_t tcp_proto_version = 2;  // 1 = speak v1 framing as initiator
    uint32_t tcp_max_server_connections = 1024;
    // Data-port limits (one client must not exhaust the port): connections
    // from one source address (0 = max(8, tcp_max_server_connections / 8)),
    // the time a fresh connection has for its first request header, the
    // time a pooled one may wait between requests, and the worker threads
    // that serve ready connections (0 = from the core count, 8..64).
    uint32_t tcp_max_connections_per_source = 0;
    uint32_t tcp_idle_timeout_ms = 5000;
    uint32_t tcp_pooled_idle_timeout_ms = 120000;
    uint32_t tcp_server_workers = 0;

    bool metadata_cache = true;
    // Same-host GPU path: advertise CUDA IPC handles for device buffers and
    // use peers' handles instead of TCP when both run on this host.
    bool enable_cuda_ipc = true;
    // Same-host CPU path (transport/samehost; needs the TCP transport):
    // between engines in two processes of this host, host memory moves by
    // cross-memory attach (process_vm_readv/writev, done by the target).
    // The target listens on a random abstract Unix socket named in its
    // descriptor and serves only processes the kernel attests (SO_PEERCRED:
    // same uid, another process; a pidfd checked before every copy); only
    // requests and statuses cross the socket. Anyone else, and two engines
    // of one process, use TCP. Off: plain TCP (env MC_DISABLE_SAME_HOST_PATH).
    bool enable_same_host = true;
    uint64_t max_notifications = 1u << 20;  // queued, not yet drained
    // Bytes (name + message) of notifications queued, and of one of them;
    // beyond either the sender is told the notify failed.
    uint64_t notify_max_bytes = uint64_t(64) << 20;
    uint32_t notify_max_message_bytes = 64u << 10;
    // Source networks (CIDR, IPv4/IPv6) allowed to connect to the handshake
    // and data ports; empty = any (env MC_ALLOWED_PEER_NETWORKS).
    std::vector<std::string> allowed_peer_networks;

    // Centralised metadata (metadata_conn_string etcd://, redis://, http://;
    // metadata/metadata_store.h). The host published in rpc_meta and as
    // the TCP data host: empty = the first non-loopback IPv4 address of an
    // interface that is up (upstream's rule; env MC_TCP_BIND_ADDRESS sets it).
    std::string advertise_host;
    std::string metadata_cluster_id;      // env MC_METADATA_CLUSTER_ID: keys under mooncake/<id>/
    uint32_t metadata_timeout_ms = 5000;  // one store call (env MC_METADATA_TIMEOUT_MS, ours)
    uint32_t metadata_lease_ttl_s = 0;    // env MC_METADATA_LEASE_TTL_SEC (ours); 0 = upstream's, none
    // Background re-fetch of every cached descriptor every N s; 0 = off
    // (env MC_TE_METADATA_REFRESH_INTERVAL_SECONDS, upstream's).
    uint32_t metadata_refresh_interval_s = 0;
    // With a store, openSegment re-reads a cached descriptor older than
    // this (env MC_METADATA_CACHE_TTL_MS, ours; 0 = never, upstream's).
    uint32_t metadata_cache_ttl_ms = 5000;
    std::string redis_username;  // env MC_REDIS_USERNAME
    std::string redis_password;  // env MC_REDIS_PASSWORD
    int redis_db = 0;            // env MC_REDIS_DB_INDEX, 0..255

    // Defaults, then the MC_* environment variables that upstream honours.
    static EngineConfig from_env(const EnvLookup &lookup = {});
    // Throws Error(kErrInvalidArgument) naming the bad field.
    void validate() const;
};

// FromEnv becomes PeerMem or DmaBuf according to WITH_NVIDIA_PEERMEM.
GpuRegistrationMode resolve_gpu_registration_mode(GpuRegistrationMode m);

// Process-wide settings a binding acts on before it creates an engine: the
// Rust crate's Protocol::Auto and its bind-address choice (C: mc_env_overrides).
struct ProcessOverrides {
    bool force_tcp = false;    // MC_FORCE_TCP set (any value): no RDMA
    bool force_hca = false;    // MC_FORCE_HCA set (any value): RDMA must come up
    std::string bind_address;  // MC_BIND_ADDRESS, "" when unset
    // MC_LEGACY_RPC_PORT_BINDING set: createTransferEngine listens on the
    // port named in local_server_name, as upstream's old releases did.
    bool legacy_rpc_port_binding = false;
    static ProcessOverrides from_env(const EnvLookup &lookup = {});
};

// MC_VERBS_LIBRARY, trimmed; "" when unset (the loader's default applies).
// Read at each load, so a program may change it between engines.
std::string verbs_library_from_env(const EnvLookup &lookup = {});
// MC_GPU_STAGE_CHUNK_KIB (64..16384, default 1024) in bytes: the pinned
// staging chunk of TCP transfers of GPU memory.
size_t gpu_stage_chunk_bytes_from_env(const EnvLookup &lookup = {});
// MC_GPU_STAGE_KERNEL (0 or 1, default 0): whether the TCP staging rings
// move small pieces between pinned staging and GPU memory with the gather
// kernel (one launch per batch) instead of one copy-engine copy each. Off
// until a GPU run has measured it.
bool gpu_stage_kernel_from_env(const EnvLookup &lookup = {});
// MC_LOG_LEVEL (TRACE, DEBUG, INFO, WARN/WARNING, ERROR; default WARN);
// applied once when the library loads.
LogLevel log_level_from_env(const EnvLookup &lookup = {});

namespace rdma {

// WITH_NVIDIA_PEERMEM, upstream's rule: unset -> true; parse_bool's
// spellings; anything else keeps the default true and yields a warning.
struct PeermemSetting {
    bool value = true;        // true = PeerMem (plain ibv_reg_mr), false = DMA-BUF
    bool recognized = true;   // false: the text was not a boolean and the default was kept
    std::string warning;      // set when !recognized
};
PeermemSetting parse_with_nvidia_peermem(const std::optional<std::string> &raw);
PeermemSetting with_nvidia_peermem_from_env(const EnvLookup &lookup = {});  // logs the warning

// A forced GID index. index -1 = automatic.
struct GidIndexOverride {
    int index = -1;
    std::string variable;  // which variable set it ("MC_GID_INDEX" or "NCCL_IB_GID_INDEX")
};

// The raw values of MC_GID_INDEX and NCCL_IB_GID_INDEX (nullopt = unset).
// NCCL_IB_GID_INDEX is consulted only when MC_GID_INDEX is unset or empty. A
// value is trimmed; "" and "-1" mean automatic (NCCL itself documents -1 as
// auto, so an NCCL setup must not break us). Anything else must be a decimal
// integer in 0..255, else Error(kErrInvalidArgument) naming the variable:
// unlike upstream we do not silently fall back, because a wrong GID index
// picks a wrong RoCE version, which only shows up as an RTR failure later.
GidIndexOverride parse_gid_index_override(const std::optional<std::string> &mc_gid_index,
                                          const std::optional<std::string> &nccl_gid_index);

// The RDMA transport's knobs (docs/wire-protocol.md, Limits and knobs). Bad
// values get upstream's "warning + default", except the GID index (above).
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
    std::vector<std::string> te_filters; // MC_TE_FILTERS (intersected with the engine's allow list)
    std::string custom_topo_json;        // MC_CUSTOM_TOPO_JSON (a file path)
    int workers_per_ctx = 2;             // MC_WORKERS_PER_CTX 1..8
    int slice_timeout_s = 0;             // MC_SLICE_TIMEOUT 1..65535 s; 0 (or unset) = off

    // Defaults overlaid with the environment (or `lookup`). Logs a warning
    // per ignored value; throws Error(kErrInvalidArgument) only for a bad
    // GID index.
    static RdmaConfig from_env(const EnvLookup &lookup = {});
    // For configs built in code: Error(kErrInvalidArgument) naming the field.
    void validate() const;

    int sl() const { return ib_sl < 0 ? 0 : ib_sl; }
};

// slice_size / ratio (ratio 0 = 4): a remainder up to slice_size + this
// stays one slice.
uint64_t fragment_limit_for(uint64_t slice_size, uint64_t fragment_ratio);

}  // namespace rdma
}  // namespace mcrs
