// Per-engine configuration. Upstream reads these from process-wide env vars;
// here each engine carries its own copy, built from the env vars by default so
// that vLLM-style deployments keep their behaviour.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mcrs {

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

    // Defaults, then the MC_* environment variables that upstream honours.
    static EngineConfig from_env();
    // Throws Error(kErrInvalidArgument) naming the bad field.
    void validate() const;
};

std::vector<std::string> split_list(const std::string &s);
// FromEnv becomes PeerMem or DmaBuf according to WITH_NVIDIA_PEERMEM.
GpuRegistrationMode resolve_gpu_registration_mode(GpuRegistrationMode m);

}  // namespace mcrs
