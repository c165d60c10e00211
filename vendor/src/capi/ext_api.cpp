// The extension C ABI (mooncake_ext.h).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

#include "capi/api_guard.h"
#include "common/text.h"
#include "core/config.h"
#include "gpu/gpu.h"
#include "mooncake_ext.h"

using namespace mcrs;

namespace {

void copy_out(const std::string &s, char *buf, size_t len, size_t *needed) {
    if (needed) *needed = s.size();
    if (!buf || len <= s.size())
        throw Error(kErrBufferTooSmall, "buffer of " + std::to_string(len) + " bytes cannot hold " +
                                            std::to_string(s.size() + 1));
    std::memcpy(buf, s.c_str(), s.size() + 1);
}

// The sizes of mc_engine_config_t before the fields from
// tcp_max_server_connections on (v1), and from advertise_host on (v2),
// were appended.
constexpr size_t config_size_before(size_t offset) {
    return (offset + alignof(mc_engine_config_t) - 1) & ~(alignof(mc_engine_config_t) - 1);
}
constexpr size_t kConfigV1Size = config_size_before(offsetof(mc_engine_config_t, tcp_max_server_connections));
constexpr size_t kConfigV2Size = config_size_before(offsetof(mc_engine_config_t, advertise_host));

EngineConfig to_engine_config(const mc_engine_config_t &c) {
    if (c.struct_size != sizeof(mc_engine_config_t) && c.struct_size != kConfigV1Size &&
        c.struct_size != kConfigV2Size)
        throw Error(kErrInvalidArgument,
                    "mc_engine_config.struct_size is " + std::to_string(c.struct_size) +
                        ", this library expects " + std::to_string(sizeof(mc_engine_config_t)) +
                        " (or " + std::to_string(kConfigV2Size) + " or " + std::to_string(kConfigV1Size) +
                        " from an older header; header/library mismatch?)");
    EngineConfig e = EngineConfig::from_env();
    e.protocols = c.protocols;
    if (c.metadata_conn_string) e.metadata_conn_string = c.metadata_conn_string;
    if (c.local_server_name) e.local_server_name = c.local_server_name;
    // NULL or "": MC_BIND_ADDRESS when set (from_env), else every interface.
    if (c.bind_address && *c.bind_address) e.bind_address = c.bind_address;
    if (c.device_allow_list) e.device_allow_list = split_list(c.device_allow_list);
    if (c.device_deny_list) e.device_deny_list = split_list(c.device_deny_list);
    e.rpc_port = c.rpc_port;
    e.tcp_data_port = c.tcp_data_port;
    e.port_min = c.port_min;
    e.port_max = c.port_max;
    e.gpu_registration_mode = static_cast<GpuRegistrationMode>(c.gpu_registration_mode);
    e.handshake_connect_timeout_ms = c.handshake_connect_timeout_ms;
    e.handshake_timeout_ms = c.handshake_timeout_ms;
    e.tcp_connect_timeout_ms = c.tcp_connect_timeout_ms;
    e.tcp_progress_timeout_ms = c.tcp_progress_timeout_ms;
    e.tcp_lanes_per_peer = c.tcp_lanes_per_peer;
    e.tcp_pipeline_depth = c.tcp_pipeline_depth;
    e.tcp_proto_version = c.tcp_proto_version;
    e.metadata_cache = c.metadata_cache != 0;
    e.enable_cuda_ipc = c.enable_cuda_ipc != 0;
    e.handshake_max_length = c.handshake_max_length;
    e.enable_same_host = c.enable_same_host != 0;
    if (c.struct_size == kConfigV1Size) return e;
    e.tcp_max_server_connections = c.tcp_max_server_connections;
    e.tcp_max_connections_per_source = c.tcp_max_connections_per_source;
    e.tcp_idle_timeout_ms = c.tcp_idle_timeout_ms;
    e.tcp_pooled_idle_timeout_ms = c.tcp_pooled_idle_timeout_ms;
    e.tcp_server_workers = c.tcp_server_workers;
    e.handshake_max_connections = c.handshake_max_connections;
    e.handshake_max_connections_per_source = c.handshake_max_connections_per_source;
    e.notify_max_message_bytes = c.notify_max_message_bytes;
    e.notify_max_bytes = c.notify_max_bytes;
    if (c.allowed_peer_networks) e.allowed_peer_networks = split_list(c.allowed_peer_networks);
    if (c.struct_size == kConfigV2Size) return e;
    if (c.advertise_host && *c.advertise_host) e.advertise_host = c.advertise_host;
    if (c.metadata_cluster_id) e.metadata_cluster_id = c.metadata_cluster_id;
    e.metadata_timeout_ms = c.metadata_timeout_ms;
    e.metadata_lease_ttl_s = c.metadata_lease_ttl_s;
    if (c.redis_username) e.redis_username = c.redis_username;
    if (c.redis_password) e.redis_password = c.redis_password;
    if (c.redis_db >= 0) e.redis_db = c.redis_db;
    if (c.redis_db < -1 || c.redis_db > 255) throw Error(kErrInvalidArgument, "redis_db must be in 0..255 (or -1)");
    return e;
}

}  // namespace

extern "C" {

int mc_engine_config_default(mc_engine_config_t *cfg) {
    return guard_errcode("mc_engine_config_default", [&] {
        if (!cfg) throw Error(kErrInvalidArgument, "config pointer is null");
        EngineConfig e = EngineConfig::from_env();
        std::memset(cfg, 0, sizeof *cfg);
        cfg->struct_size = sizeof *cfg;
        cfg->protocols = e.protocols;
        cfg->metadata_conn_string = nullptr;  // "P2PHANDSHAKE"
        cfg->local_server_name = nullptr;     // "127.0.0.1"
        cfg->rpc_port = e.rpc_port;
        cfg->tcp_data_port = e.tcp_data_port;
        cfg->port_min = e.port_min;
        cfg->port_max = e.port_max;
        cfg->gpu_registration_mode = static_cast<int32_t>(e.gpu_registration_mode);
        cfg->handshake_connect_timeout_ms = e.handshake_connect_timeout_ms;
        cfg->handshake_timeout_ms = e.handshake_timeout_ms;
        cfg->tcp_connect_timeout_ms = e.tcp_connect_timeout_ms;
        cfg->tcp_progress_timeout_ms = e.tcp_progress_timeout_ms;
        cfg->tcp_lanes_per_peer = e.tcp_lanes_per_peer;
        cfg->tcp_pipeline_depth = e.tcp_pipeline_depth;
        cfg->tcp_proto_version = e.tcp_proto_version;
        cfg->metadata_cache = e.metadata_cache ? 1 : 0;
        cfg->enable_cuda_ipc = e.enable_cuda_ipc ? 1 : 0;
        cfg->handshake_max_length = e.handshake_max_length;
        cfg->enable_same_host = e.enable_same_host ? 1 : 0;
        cfg->tcp_max_server_connections = e.tcp_max_server_connections;
        cfg->tcp_max_connections_per_source = e.tcp_max_connections_per_source;
        cfg->tcp_idle_timeout_ms = e.tcp_idle_timeout_ms;
        cfg->tcp_pooled_idle_timeout_ms = e.tcp_pooled_idle_timeout_ms;
        cfg->tcp_server_workers = e.tcp_server_workers;
        cfg->handshake_max_connections = e.handshake_max_connections;
        cfg->handshake_max_connections_per_source = e.handshake_max_connections_per_source;
        cfg->notify_max_message_bytes = e.notify_max_message_bytes;
        cfg->notify_max_bytes = e.notify_max_bytes;
        cfg->allowed_peer_networks = nullptr;  // MC_ALLOWED_PEER_NETWORKS or any
        cfg->advertise_host = nullptr;         // MC_TCP_BIND_ADDRESS, else the first non-loopback address
        cfg->metadata_cluster_id = nullptr;    // MC_METADATA_CLUSTER_ID
        cfg->metadata_timeout_ms = e.metadata_timeout_ms;
        cfg->metadata_lease_ttl_s = e.metadata_lease_ttl_s;
        cfg->redis_username = nullptr;  // MC_REDIS_USERNAME
        cfg->redis_password = nullptr;  // MC_REDIS_PASSWORD
        cfg->redis_db = -1;             // MC_REDIS_DB_INDEX
        return 0;
    });
}

transfer_engine_t mc_engine_create(const mc_engine_config_t *cfg) {
    return guard_value<transfer_engine_t>("mc_engine_create", nullptr, [&]() -> transfer_engine_t {
        if (!cfg) throw Error(kErrInvalidArgument, "config pointer is null");
        return new TransferEngine(to_engine_config(*cfg));
    });
}

const char *mc_last_error_message(void) { return last_error_message(); }

int mc_last_error_code(void) { return last_error_code(); }

const char *mc_error_name(int code) { return error_name(code); }

int mc_set_log_sink(mc_log_sink_fn sink, void *user_data, int min_level) {
    return guard_errcode("mc_set_log_sink", [&] {
        if (min_level < MC_LOG_TRACE || min_level > MC_LOG_OFF)
            throw Error(kErrInvalidArgument, "log level " + std::to_string(min_level) + " is not 0..5");
        set_log_sink(sink, user_data, static_cast<LogLevel>(min_level));
        return 0;
    });
}

const char *mc_engine_version(void) { return MC_ENGINE_VERSION; }

int mc_engine_segment_name(transfer_engine_t engine, char *buf, size_t len, size_t *needed) {
    return guard_errcode("mc_engine_segment_name", [&] {
        copy_out(engine_of(engine, "mc_engine_segment_name")->segment_name(), buf, len, needed);
        return 0;
    });
}

int mc_engine_rdma_topology(transfer_engine_t engine, char *buf, size_t len, size_t *needed) {
    return guard_errcode("mc_engine_rdma_topology", [&] {
        copy_out(engine_of(engine, "mc_engine_rdma_topology")->rdma_topology().dump(), buf, len, needed);
        return 0;
    });
}

int mc_engine_rdma_counters(transfer_engine_t engine, char *buf, size_t len, size_t *needed) {
    return guard_errcode("mc_engine_rdma_counters", [&] {
        copy_out(engine_of(engine, "mc_engine_rdma_counters")->rdma_counters().dump(), buf, len, needed);
        return 0;
    });
}

int mc_engine_ports(transfer_engine_t engine, uint16_t *rpc_port, uint16_t *tcp_data_port) {
    return guard_errcode("mc_engine_ports", [&] {
        TransferEngine *e = engine_of(engine, "mc_engine_ports");
        if (rpc_port) *rpc_port = e->rpc_port();
        if (tcp_data_port) *tcp_data_port = e->tcp_data_port();
        return 0;
    });
}

int mc_engine_event_fd(transfer_engine_t engine, int *fd) {
    return guard_errcode("mc_engine_event_fd", [&] {
        TransferEngine *e = engine_of(engine, "mc_engine_event_fd");
        if (!fd) throw Error(kErrInvalidArgument, "fd pointer is null");
        *fd = e->event_fd();
        return 0;
    });
}

int mc_engine_take_completions(transfer_engine_t engine, batch_id_t *ids, size_t cap, size_t *n,
                               int *overflowed) {
    return guard_errcode("mc_engine_take_completions", [&] {
        TransferEngine *e = engine_of(engine, "mc_engine_take_completions");
        if (!n || !overflowed) throw Error(kErrInvalidArgument, "n or overflowed pointer is null");
        if (!ids && cap > 0) throw Error(kErrInvalidArgument, "ids is null with cap > 0");
        bool over = false;
        *n = e->take_completions(ids, cap, over);
        *overflowed = over ? 1 : 0;
        return 0;
    });
}

int mc_engine_gpu_registration_mode(transfer_engine_t engine, int32_t *mode) {
    return guard_errcode("mc_engine_gpu_registration_mode", [&] {
        TransferEngine *e = engine_of(engine, "mc_engine_gpu_registration_mode");
        if (!mode) throw Error(kErrInvalidArgument, "mode pointer is null");
        *mode = static_cast<int32_t>(e->config().gpu_registration_mode);
        return 0;
    });
}

int mc_memory_location(transfer_engine_t engine, const void *addr, char *buf, size_t len) {
    return guard_errcode("mc_memory_location", [&] {
        TransferEngine *e = engine_of(engine, "mc_memory_location");
        std::string loc = e->location_of(addr);
        if (loc.empty()) throw Error(kErrAddressNotRegistered, "no registered buffer holds this address");
        copy_out(loc, buf, len, nullptr);
        return 0;
    });
}

int mc_engine_device_filters(transfer_engine_t engine, char *allow, size_t allow_len, char *deny,
                             size_t deny_len) {
    return guard_errcode("mc_engine_device_filters", [&] {
        TransferEngine *e = engine_of(engine, "mc_engine_device_filters");
        copy_out(join_list(e->config().device_allow_list), allow, allow_len, nullptr);
        copy_out(join_list(e->config().device_deny_list), deny, deny_len, nullptr);
        return 0;
    });
}

int mc_segment_buffers(transfer_engine_t engine, segment_id_t segment_id, mc_buffer_info_t *out,
                       size_t cap, size_t *count) {
    return guard_errcode("mc_segment_buffers", [&] {
        TransferEngine *e = engine_of(engine, "mc_segment_buffers");
        auto d = e->segment_desc(segment_id);
        if (!d) throw Error(kErrInvalidArgument, "unknown segment id " + std::to_string(segment_id));
        if (count) *count = d->buffers.size();
        for (size_t i = 0; i < d->buffers.size() && i < cap && out; ++i) {
            out[i].addr = d->buffers[i].addr;
            out[i].length = d->buffers[i].length;
        }
        return 0;
    });
}

int mc_segment_protocol(transfer_engine_t engine, segment_id_t segment_id, char *buf, size_t len) {
    return guard_errcode("mc_segment_protocol", [&] {
        auto d = engine_of(engine, "mc_segment_protocol")->segment_desc(segment_id);
        if (!d) throw Error(kErrInvalidArgument, "unknown segment id " + std::to_string(segment_id));
        copy_out(d->protocol, buf, len, nullptr);
        return 0;
    });
}

int mc_segment_probe(transfer_engine_t engine, segment_id_t segment_id) {
    return guard_errcode("mc_segment_probe", [&] {
        engine_of(engine, "mc_segment_probe")->probe_segment(segment_id);
        return 0;
    });
}

int mc_wait_region_idle(transfer_engine_t engine, void *addr, int64_t timeout_ms) {
    return guard_errcode("mc_wait_region_idle", [&] {
        if (!engine_of(engine, "mc_wait_region_idle")->wait_region_idle(addr, timeout_ms))
            throw Error(kErrTimeout, "transfers still touch the buffer after " +
                                         std::to_string(timeout_ms) + " ms");
        return 0;
    });
}

int mc_batch_wait(transfer_engine_t engine, batch_id_t batch_id, int64_t timeout_ms) {
    return guard_errcode("mc_batch_wait", [&] {
        if (!engine_of(engine, "mc_batch_wait")->wait_batch(batch_id, timeout_ms))
            throw Error(kErrTimeout, "batch " + std::to_string(batch_id) + " still has tasks in flight after " +
                                         std::to_string(timeout_ms) + " ms");
        return 0;
    });
}

int mc_batch_reset(transfer_engine_t engine, batch_id_t batch_id) {
    return guard_status("mc_batch_reset", [&] {
        engine_of(engine, "mc_batch_reset")->reset_batch(batch_id);
        return 0;
    });
}

static_assert(sizeof(mc_block_region_t) == sizeof(BlockRegion) &&
                  offsetof(mc_block_region_t, local_base) == offsetof(BlockRegion, local_base) &&
                  offsetof(mc_block_region_t, remote_base) == offsetof(BlockRegion, remote_base) &&
                  offsetof(mc_block_region_t, local_stride) == offsetof(BlockRegion, local_stride) &&
                  offsetof(mc_block_region_t, remote_stride) == offsetof(BlockRegion, remote_stride) &&
                  offsetof(mc_block_region_t, block_len) == offsetof(BlockRegion, block_len),
              "mc_block_region_t and BlockRegion share one layout");

int mc_submit_blocks(transfer_engine_t engine, batch_id_t batch_id, int opcode, segment_id_t target_id,
                     const mc_block_region_t *regions, size_t num_regions, const uint64_t *local_ids,
                     const uint64_t *remote_ids, size_t num_blocks, size_t *task) {
    return guard_status("mc_submit_blocks", [&] {
        TransferEngine *e = engine_of(engine, "mc_submit_blocks");
        BlockList l;
        l.opcode = opcode;
        l.target_id = target_id;
        l.regions = reinterpret_cast<const BlockRegion *>(regions);
        l.num_regions = num_regions;
        l.local_ids = local_ids;
        l.remote_ids = remote_ids;
        l.num_blocks = num_blocks;
        size_t t = e->submit_blocks(batch_id, l);
        if (task) *task = t;
        return 0;
    });
}

int mc_batch_status(transfer_engine_t engine, batch_id_t batch_id, struct transfer_status *out,
                    size_t cap, size_t *count) {
    return guard_errcode("mc_batch_status", [&] {
        TransferEngine *e = engine_of(engine, "mc_batch_status");
        // Statuses are gathered through a small stack chunk: no allocation,
        // and one pass over the tasks whatever the batch size.
        constexpr size_t kChunk = 256;
        int st[kChunk];
        uint64_t by[kChunk];
        size_t n = e->batch_statuses(batch_id, 0, nullptr, nullptr, 0);
        if (count) *count = n;
        if (!out) return 0;
        size_t lim = cap < n ? cap : n;
        for (size_t start = 0; start < lim; start += kChunk) {
            size_t len = std::min(kChunk, lim - start);
            e->batch_statuses(batch_id, start, st, by, len);
            for (size_t i = 0; i < len; ++i) out[start + i] = transfer_status{st[i], by[i]};
        }
        return 0;
    });
}

int mc_transfer_error(transfer_engine_t engine, batch_id_t batch_id, size_t task_id, char *buf,
                      size_t len, size_t *needed) {
    return guard_errcode("mc_transfer_error", [&] {
        std::string s = engine_of(engine, "mc_transfer_error")->task_error(batch_id, task_id);
        copy_out(s, buf, len, needed);
        return 0;
    });
}

int mc_engine_get_counters(transfer_engine_t engine, mc_engine_counters_t *out) {
    return guard_errcode("mc_engine_get_counters", [&] {
        if (!out) throw Error(kErrInvalidArgument, "out pointer is null");
        auto c = engine_of(engine, "mc_engine_get_counters")->counters();
        *out = mc_engine_counters_t{c.tcp_sent,       c.tcp_served,    c.tcp_rejected,
                                    c.ipc_copies,     c.local_copies,  c.same_host_sent,
                                    c.same_host_served};
        return 0;
    });
}

int mc_get_env_overrides(mc_env_overrides_t *out) {
    return guard_errcode("mc_get_env_overrides", [&] {
        if (!out) throw Error(kErrInvalidArgument, "out pointer is null");
        ProcessOverrides o = ProcessOverrides::from_env();
        if (o.bind_address.size() >= sizeof out->bind_address)
            throw Error(kErrInvalidArgument, "MC_BIND_ADDRESS is " +
                                                 std::to_string(o.bind_address.size()) +
                                                 " bytes; at most 255 are accepted");
        std::memset(out, 0, sizeof *out);
        out->struct_size = sizeof *out;
        out->force_tcp = o.force_tcp ? 1u : 0u;
        out->force_hca = o.force_hca ? 1u : 0u;
        std::memcpy(out->bind_address, o.bind_address.c_str(), o.bind_address.size() + 1);
        return 0;
    });
}

int mc_engine_get_limit_counters(transfer_engine_t engine, mc_engine_limit_counters_t *out) {
    return guard_errcode("mc_engine_get_limit_counters", [&] {
        if (!out) throw Error(kErrInvalidArgument, "out pointer is null");
        auto c = engine_of(engine, "mc_engine_get_limit_counters")->counters();
        *out = mc_engine_limit_counters_t{c.tcp_conns_refused, c.tcp_conns_idle_closed,
                                          c.hs_conns_refused, c.notifies_refused,
                                          c.notify_bytes_queued};
        return 0;
    });
}

int mc_engine_get_batch_counters(transfer_engine_t engine, mc_engine_batch_counters_t *out) {
    return guard_errcode("mc_engine_get_batch_counters", [&] {
        if (!out) throw Error(kErrInvalidArgument, "out pointer is null");
        auto c = engine_of(engine, "mc_engine_get_batch_counters")->counters();
        *out = mc_engine_batch_counters_t{c.tasks_submitted, c.task_status_reads};
        return 0;
    });
}

int mc_gpu_query(mc_gpu_info_t *info, char *reason, size_t reason_len) {
    return guard_errcode("mc_gpu_query", [&] {
        if (!info) throw Error(kErrInvalidArgument, "info pointer is null");
        const gpu::Status &s = gpu::status();
        info->build_cuda_major = gpu::build_major();
        info->runtime_version = s.runtime_version;
        info->driver_version = s.driver_version;
        info->device_count = s.device_count;
        info->usable = s.usable ? 1 : 0;
        if (reason && reason_len > 0) std::snprintf(reason, reason_len, "%s", s.usable ? "" : s.reason.c_str());
        return 0;
    });
}

int mc_gpu_alloc(int device, size_t size, void **ptr) {
    return guard_errcode("mc_gpu_alloc", [&] {
        if (!ptr || size == 0) throw Error(kErrInvalidArgument, "need an out-pointer and a non-zero size");
        *ptr = gpu::alloc_device(device, size);
        return 0;
    });
}

int mc_gpu_free(int device, void *ptr) {
    return guard_errcode("mc_gpu_free", [&] {
        gpu::free_device(ptr, device);
        return 0;
    });
}

int mc_gpu_alloc_pinned(size_t size, void **ptr) {
    return guard_errcode("mc_gpu_alloc_pinned", [&] {
        if (!ptr || size == 0) throw Error(kErrInvalidArgument, "need an out-pointer and a non-zero size");
        *ptr = gpu::alloc_pinned(size);
        return 0;
    });
}

int mc_gpu_free_pinned(void *ptr) {
    return guard_errcode("mc_gpu_free_pinned", [&] {
        gpu::free_pinned(ptr);
        return 0;
    });
}

int mc_gpu_memcpy(void *dst, const void *src, size_t size) {
    return guard_errcode("mc_gpu_memcpy", [&] {
        if (size == 0) return 0;
        if (!dst || !src) throw Error(kErrInvalidArgument, "null pointer");
        gpu::copy(dst, src, size);
        return 0;
    });
}

int mc_gpu_memset(int device, void *ptr, int value, size_t size) {
    return guard_errcode("mc_gpu_memset", [&] {
        if (!ptr) throw Error(kErrInvalidArgument, "null pointer");
        gpu::memset_device(ptr, value, size, device);
        return 0;
    });
}

int mc_gpu_pointer_device(const void *ptr, int32_t *device) {
    return guard_errcode("mc_gpu_pointer_device", [&] {
        if (!device) throw Error(kErrInvalidArgument, "device pointer is null");
        gpu::PointerKind k = gpu::classify(ptr);
        *device = k.device ? k.ordinal : -1;
        return 0;
    });
}

int mc_gpu_dmabuf_export(const void *ptr, size_t size, mc_dmabuf_t *out) {
    return guard_errcode("mc_gpu_dmabuf_export", [&] {
        if (!out || !ptr || size == 0) throw Error(kErrInvalidArgument, "need a pointer, a size and an out struct");
        gpu::DmabufExport x;
        gpu::dmabuf_export(ptr, size, x);
        out->fd = x.fd;
        out->device = x.device;
        out->offset = x.offset;
        out->base = x.base;
        out->size = x.size;
        return 0;
    });
}

int mc_gpu_dmabuf_supported(int device, int32_t *supported) {
    return guard_errcode("mc_gpu_dmabuf_supported", [&] {
        if (!supported) throw Error(kErrInvalidArgument, "out pointer is null");
        gpu::require_usable("DMA-BUF support query");
        *supported = gpu::dmabuf_supported(device) ? 1 : 0;
        return 0;
    });
}

#define MC_ABI_STRUCT(T) {#T, "", 0, sizeof(T)}
#define MC_ABI_FIELD(T, F) {#T, #F, offsetof(T, F), sizeof(((T *)nullptr)->F)}

// One line per field of every public struct: a table, longer than a
// function should be, kept whole so it reads like the header it mirrors.
size_t mc_abi_describe(const mc_abi_field_t **fields) {
    static const mc_abi_field_t kFields[] = {
        MC_ABI_STRUCT(transfer_request),
        MC_ABI_FIELD(transfer_request, opcode),
        MC_ABI_FIELD(transfer_request, source),
        MC_ABI_FIELD(transfer_request, target_id),
        MC_ABI_FIELD(transfer_request, target_offset),
        MC_ABI_FIELD(transfer_request, length),
        MC_ABI_STRUCT(transfer_status),
        MC_ABI_FIELD(transfer_status, status),
        MC_ABI_FIELD(transfer_status, transferred_bytes),
        MC_ABI_STRUCT(notify_msg),
        MC_ABI_FIELD(notify_msg, name),
        MC_ABI_FIELD(notify_msg, msg),
        MC_ABI_STRUCT(buffer_entry),
        MC_ABI_FIELD(buffer_entry, addr),
        MC_ABI_FIELD(buffer_entry, length),
        MC_ABI_STRUCT(nic_load_stat),
        MC_ABI_FIELD(nic_load_stat, device_name),
        MC_ABI_FIELD(nic_load_stat, inflight_bytes),
        MC_ABI_FIELD(nic_load_stat, ewma_bandwidth_bps),
        MC_ABI_STRUCT(segment_desc),
        MC_ABI_STRUCT(mc_block_region),
        MC_ABI_FIELD(mc_block_region, local_base),
        MC_ABI_FIELD(mc_block_region, remote_base),
        MC_ABI_FIELD(mc_block_region, local_stride),
        MC_ABI_FIELD(mc_block_region, remote_stride),
        MC_ABI_FIELD(mc_block_region, block_len),
        MC_ABI_STRUCT(mc_buffer_info),
        MC_ABI_FIELD(mc_buffer_info, addr),
        MC_ABI_FIELD(mc_buffer_info, length),
        MC_ABI_STRUCT(mc_abi_field),
        MC_ABI_FIELD(mc_abi_field, type_name),
        MC_ABI_FIELD(mc_abi_field, field_name),
        MC_ABI_FIELD(mc_abi_field, offset),
        MC_ABI_FIELD(mc_abi_field, size),
        MC_ABI_STRUCT(mc_engine_counters),
        MC_ABI_FIELD(mc_engine_counters, tcp_requests_sent),
        MC_ABI_FIELD(mc_engine_counters, tcp_requests_served),
        MC_ABI_FIELD(mc_engine_counters, tcp_requests_rejected),
        MC_ABI_FIELD(mc_engine_counters, ipc_copies),
        MC_ABI_FIELD(mc_engine_counters, local_copies),
        MC_ABI_FIELD(mc_engine_counters, same_host_requests),
        MC_ABI_FIELD(mc_engine_counters, same_host_served),
        MC_ABI_STRUCT(mc_gpu_info),
        MC_ABI_FIELD(mc_gpu_info, build_cuda_major),
        MC_ABI_FIELD(mc_gpu_info, runtime_version),
        MC_ABI_FIELD(mc_gpu_info, driver_version),
        MC_ABI_FIELD(mc_gpu_info, device_count),
        MC_ABI_FIELD(mc_gpu_info, usable),
        MC_ABI_STRUCT(mc_dmabuf),
        MC_ABI_FIELD(mc_dmabuf, fd),
        MC_ABI_FIELD(mc_dmabuf, device),
        MC_ABI_FIELD(mc_dmabuf, offset),
        MC_ABI_FIELD(mc_dmabuf, base),
        MC_ABI_FIELD(mc_dmabuf, size),
        MC_ABI_STRUCT(mc_engine_config),
        MC_ABI_FIELD(mc_engine_config, struct_size),
        MC_ABI_FIELD(mc_engine_config, protocols),
        MC_ABI_FIELD(mc_engine_config, metadata_conn_string),
        MC_ABI_FIELD(mc_engine_config, local_server_name),
        MC_ABI_FIELD(mc_engine_config, bind_address),
        MC_ABI_FIELD(mc_engine_config, device_allow_list),
        MC_ABI_FIELD(mc_engine_config, device_deny_list),
        MC_ABI_FIELD(mc_engine_config, rpc_port),
        MC_ABI_FIELD(mc_engine_config, tcp_data_port),
        MC_ABI_FIELD(mc_engine_config, port_min),
        MC_ABI_FIELD(mc_engine_config, port_max),
        MC_ABI_FIELD(mc_engine_config, gpu_registration_mode),
        MC_ABI_FIELD(mc_engine_config, handshake_connect_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, handshake_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, tcp_connect_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, tcp_progress_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, tcp_lanes_per_peer),
        MC_ABI_FIELD(mc_engine_config, tcp_pipeline_depth),
        MC_ABI_FIELD(mc_engine_config, tcp_proto_version),
        MC_ABI_FIELD(mc_engine_config, metadata_cache),
        MC_ABI_FIELD(mc_engine_config, enable_cuda_ipc),
        MC_ABI_FIELD(mc_engine_config, handshake_max_length),
        MC_ABI_FIELD(mc_engine_config, enable_same_host),
        MC_ABI_FIELD(mc_engine_config, tcp_max_server_connections),
        MC_ABI_FIELD(mc_engine_config, tcp_max_connections_per_source),
        MC_ABI_FIELD(mc_engine_config, tcp_idle_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, tcp_pooled_idle_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, tcp_server_workers),
        MC_ABI_FIELD(mc_engine_config, handshake_max_connections),
        MC_ABI_FIELD(mc_engine_config, handshake_max_connections_per_source),
        MC_ABI_FIELD(mc_engine_config, notify_max_message_bytes),
        MC_ABI_FIELD(mc_engine_config, notify_max_bytes),
        MC_ABI_FIELD(mc_engine_config, allowed_peer_networks),
        MC_ABI_FIELD(mc_engine_config, advertise_host),
        MC_ABI_FIELD(mc_engine_config, metadata_cluster_id),
        MC_ABI_FIELD(mc_engine_config, metadata_timeout_ms),
        MC_ABI_FIELD(mc_engine_config, metadata_lease_ttl_s),
        MC_ABI_FIELD(mc_engine_config, redis_username),
        MC_ABI_FIELD(mc_engine_config, redis_password),
        MC_ABI_FIELD(mc_engine_config, redis_db),
        MC_ABI_STRUCT(mc_env_overrides),
        MC_ABI_FIELD(mc_env_overrides, struct_size),
        MC_ABI_FIELD(mc_env_overrides, force_tcp),
        MC_ABI_FIELD(mc_env_overrides, force_hca),
        MC_ABI_FIELD(mc_env_overrides, bind_address),
        MC_ABI_STRUCT(mc_engine_limit_counters),
        MC_ABI_FIELD(mc_engine_limit_counters, tcp_connections_refused),
        MC_ABI_FIELD(mc_engine_limit_counters, tcp_connections_idle_closed),
        MC_ABI_FIELD(mc_engine_limit_counters, handshake_connections_refused),
        MC_ABI_FIELD(mc_engine_limit_counters, notifications_refused),
        MC_ABI_FIELD(mc_engine_limit_counters, notification_bytes_queued),
    };
    if (fields) *fields = kFields;
    return sizeof kFields / sizeof kFields[0];
}

}  // extern "C"
