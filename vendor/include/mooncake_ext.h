/*
 * mooncake_ext.h - what the upstream-compatible C ABI (transfer_engine_c.h)
 * lacks: a per-engine configuration, the calling thread's last error, a log
 * sink, the engine version, remote segment buffer lists, batch waiting and
 * per-task failure reasons, engine-allocated buffers, one-call synchronous
 * transfers, and an ABI self-description for layout checks.
 *
 * Conventions: functions return 0 on success or a negative error code
 * (the ERR_* values below); every failure records a message for the calling
 * thread (mc_last_error_message). No C++ exception leaves these functions.
 */
#ifndef MOONCAKE_RS_EXT_H
#define MOONCAKE_RS_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "transfer_engine_c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MC_ENGINE_VERSION "0.2.0"

/* Negative error codes; numerically identical to upstream's error.h. */
#define ERR_INVALID_ARGUMENT (-1)
#define ERR_TOO_MANY_REQUESTS (-2)
#define ERR_ADDRESS_NOT_REGISTERED (-3)
#define ERR_BATCH_BUSY (-4)
#define ERR_DEVICE_NOT_FOUND (-6)
#define ERR_ADDRESS_OVERLAPPED (-7)
#define ERR_DNS (-101)
#define ERR_SOCKET (-102)
#define ERR_MALFORMED_JSON (-103)
#define ERR_REJECT_HANDSHAKE (-104)
#define ERR_METADATA (-200)
#define ERR_ENDPOINT (-201)
#define ERR_CONTEXT (-202)
#define ERR_NUMA (-300)
#define ERR_CLOCK (-301)
#define ERR_MEMORY (-302)
#define ERR_NOT_IMPLEMENTED (-303)
/* Extension codes (not in upstream). */
#define MC_ERR_TIMEOUT (-1001)
#define MC_ERR_SHUTDOWN (-1002)
#define MC_ERR_BUFFER_TOO_SMALL (-1003)
#define MC_ERR_INTERNAL (-1004)
#define MC_ERR_TRANSFER_FAILED (-1005)

/* Positive status codes returned by submit/status/free calls. */
#define MC_STATUS_OK (0)
#define MC_STATUS_INVALID_ARGUMENT (1)
#define MC_STATUS_TOO_MANY_REQUESTS (2)
#define MC_STATUS_ADDRESS_NOT_REGISTERED (3)
#define MC_STATUS_BATCH_BUSY (4)
#define MC_STATUS_NOT_SUPPORTED_TRANSPORT (8)
#define MC_STATUS_NOT_IMPLEMENTED (999)

/* Protocol bits for mc_engine_config.protocols. */
#define MC_PROTOCOL_TCP (1u << 0)
#define MC_PROTOCOL_RDMA (1u << 1)

/* GPU memory registration for RDMA (see WITH_NVIDIA_PEERMEM). */
#define MC_GPU_REG_FROM_ENV (0)
#define MC_GPU_REG_PEERMEM (1)
#define MC_GPU_REG_DMABUF (2)
#define MC_GPU_REG_AUTO (3)

/* Log levels of the sink. */
#define MC_LOG_TRACE (0)
#define MC_LOG_DEBUG (1)
#define MC_LOG_INFO (2)
#define MC_LOG_WARN (3)
#define MC_LOG_ERROR (4)
#define MC_LOG_OFF (5)

/*
 * Per-engine configuration. Fill it with mc_engine_config_default(), which
 * applies upstream's MC_* environment variables, then override fields.
 * String fields may be NULL (= default); they are copied by mc_engine_create.
 */
typedef struct mc_engine_config {
    uint32_t struct_size;            /* sizeof(mc_engine_config_t) */
    uint32_t protocols;              /* MC_PROTOCOL_* bits; 0 = none yet */
    const char *metadata_conn_string; /* "P2PHANDSHAKE" */
    const char *local_server_name;   /* "host" or "host:port" */
    const char *bind_address;        /* NULL/"" = env MC_BIND_ADDRESS, else wildcard */
    const char *device_allow_list;   /* comma-separated RDMA devices */
    const char *device_deny_list;
    uint16_t rpc_port;               /* 0 = random in [port_min, port_max] */
    uint16_t tcp_data_port;          /* 0 = random in [port_min, port_max] */
    uint16_t port_min;
    uint16_t port_max;
    int32_t gpu_registration_mode;   /* MC_GPU_REG_* */
    uint32_t handshake_connect_timeout_ms;
    uint32_t handshake_timeout_ms;
    uint32_t tcp_connect_timeout_ms;
    uint32_t tcp_progress_timeout_ms;
    uint32_t tcp_lanes_per_peer;
    uint32_t tcp_pipeline_depth;
    uint32_t tcp_proto_version;      /* 2, or 1 to speak legacy framing */
    uint32_t metadata_cache;         /* 1 = cache remote descriptors */
    uint32_t enable_cuda_ipc;        /* 1 = same-host GPU path (CUDA IPC) */
    uint64_t handshake_max_length;
    /* 1 = same-host CPU path: peers in another process on this host move
     * host memory by cross-memory attach (process_vm_readv/writev) instead
     * of TCP payload, over a Unix socket where the kernel attests who they
     * are (same uid, another process; trust model: docs/perf-notes.md);
     * falls back to TCP when refused. 0 = TCP
     * only, as initiator and as target (MC_DISABLE_SAME_HOST_PATH). */
    uint32_t enable_same_host;
    /* Appended fields. A caller built against the header without them
     * passes the older struct_size; they then keep their defaults. */
    /* Data port: connections in all, and from one source address (0 =
     * max(8, total / 8)); a fresh connection's time for its first request
     * header; a pooled connection's idle time between requests; worker
     * threads serving ready connections (0 = from the core count). */
    uint32_t tcp_max_server_connections;
    uint32_t tcp_max_connections_per_source;
    uint32_t tcp_idle_timeout_ms;
    uint32_t tcp_pooled_idle_timeout_ms;
    uint32_t tcp_server_workers;
    /* Handshake port: connections in all (the oldest is shed beyond it),
     * and from one source address (0 = max(8, total / 8)). */
    uint32_t handshake_max_connections;
    uint32_t handshake_max_connections_per_source;
    /* Received notifications: bytes of name + message of one, and of all
     * queued (not yet drained); beyond either the sender's notify fails. */
    uint32_t notify_max_message_bytes;
    uint64_t notify_max_bytes;
    /* Comma-separated CIDR networks (IPv4/IPv6) that may connect to the
     * handshake and data ports; NULL = MC_ALLOWED_PEER_NETWORKS or any,
     * "" = any. */
    const char *allowed_peer_networks;
    /* Appended: centralised metadata (metadata_conn_string "etcd://...",
     * "redis://..." or "http://..."; see README, Metadata stores). */
    /* Host published in rpc_meta and as the TCP data host; NULL/"" = env
     * MC_TCP_BIND_ADDRESS, else the first non-loopback IPv4 address of an
     * interface that is up (upstream's rule). Not used in P2PHANDSHAKE. */
    const char *advertise_host;
    /* Key prefix "mooncake/<id>/"; NULL = env MC_METADATA_CLUSTER_ID. */
    const char *metadata_cluster_id;
    /* One store call (every etcd endpoint tried), 1..600000 ms; default
     * 5000 (env MC_METADATA_TIMEOUT_MS). */
    uint32_t metadata_timeout_ms;
    /* 0 (upstream) = keys live until the engine deletes them; N = etcd
     * lease / Redis expiry of N s kept alive by the engine, so a crashed
     * engine's keys vanish (env MC_METADATA_LEASE_TTL_SEC; 0..86400). */
    uint32_t metadata_lease_ttl_s;
    /* Redis AUTH and SELECT; NULL = env MC_REDIS_USERNAME /
     * MC_REDIS_PASSWORD; redis_db -1 = env MC_REDIS_DB_INDEX (else 0). */
    const char *redis_username;
    const char *redis_password;
    int32_t redis_db;
} mc_engine_config_t;

int mc_engine_config_default(mc_engine_config_t *cfg);

/*
 * Process-wide settings that a binding acts on before it creates an engine
 * (the engine itself reads every other variable): MC_FORCE_TCP and
 * MC_FORCE_HCA (set to any value) and MC_BIND_ADDRESS (trimmed; "" when
 * unset). Bindings call this instead of reading the environment, so that
 * the engine's parser is the only one. Fails with MC_ERR_INVALID_ARGUMENT
 * when MC_BIND_ADDRESS is longer than bind_address can hold.
 */
typedef struct mc_env_overrides {
    uint32_t struct_size;       /* sizeof(mc_env_overrides_t) */
    uint32_t force_tcp;         /* 1: no RDMA, even for an automatic choice */
    uint32_t force_hca;         /* 1: an automatic choice must bring up RDMA */
    char bind_address[256];     /* NUL-terminated */
} mc_env_overrides_t;
int mc_get_env_overrides(mc_env_overrides_t *out);
/* Returns NULL on failure (see mc_last_error_message). */
transfer_engine_t mc_engine_create(const mc_engine_config_t *cfg);

/* Last failure on the calling thread. The string stays valid until the next
 * call into this library on the same thread. */
const char *mc_last_error_message(void);
int mc_last_error_code(void);
/* Symbolic name of a code, e.g. "ERR_SOCKET". Static storage. */
const char *mc_error_name(int code);

/* Process-wide log sink; NULL restores the default (stderr). The sink is
 * called from engine threads, one message at a time; it must not call
 * mc_set_log_sink itself. */
typedef void (*mc_log_sink_fn)(void *user_data, int level, const char *message);
int mc_set_log_sink(mc_log_sink_fn sink, void *user_data, int min_level);

/* Engine version string (MC_ENGINE_VERSION). Static storage. */
const char *mc_engine_version(void);

/* The engine's segment name, NUL-terminated. Returns the length needed
 * (without NUL) in *needed; MC_ERR_BUFFER_TOO_SMALL when it did not fit. */
int mc_engine_segment_name(transfer_engine_t engine, char *buf, size_t len, size_t *needed);
int mc_engine_ports(transfer_engine_t engine, uint16_t *rpc_port, uint16_t *tcp_data_port);
/* The GPU registration mode in force (MC_GPU_REG_PEERMEM, _DMABUF or _AUTO;
 * MC_GPU_REG_FROM_ENV is resolved from WITH_NVIDIA_PEERMEM at creation). */
int mc_engine_gpu_registration_mode(transfer_engine_t engine, int32_t *mode);
/* The RDMA device allow-list and deny-list, comma-separated. */
int mc_engine_device_filters(transfer_engine_t engine, char *allow, size_t allow_len, char *deny,
                             size_t deny_len);

/* The RDMA transport's discovered topology as JSON, NUL-terminated:
 * {"devices":[{"name","link_layer","numa_node","usable","gid","lid"}...],
 *  "priority_matrix":{"<location>":[[preferred...],[available...]]}}.
 * *needed as for mc_engine_segment_name. MC_ERR_INVALID_ARGUMENT when the
 * engine has no RDMA transport installed. */
int mc_engine_rdma_topology(transfer_engine_t engine, char *buf, size_t len, size_t *needed);
/* Per-NIC RDMA counters as JSON, NUL-terminated: [{"name","link_layer",
 * "numa_node","usable","work_requests","bytes","errors","retries"}...].
 * Same conventions as mc_engine_rdma_topology. */
int mc_engine_rdma_counters(transfer_engine_t engine, char *buf, size_t len, size_t *needed);

/* Location of the local registered buffer holding `addr` ("cuda:<device>",
 * "cpu:<numa node>", or what the caller passed), NUL-terminated. */
int mc_memory_location(transfer_engine_t engine, const void *addr, char *buf, size_t len);

/* Buffers of an opened remote segment, as its descriptor lists them. */
typedef struct mc_buffer_info {
    uint64_t addr;
    uint64_t length;
} mc_buffer_info_t;
int mc_segment_buffers(transfer_engine_t engine, segment_id_t segment_id,
                       mc_buffer_info_t *out, size_t cap, size_t *count);
/* Protocol name of an opened segment ("tcp", ...), NUL-terminated. */
int mc_segment_protocol(transfer_engine_t engine, segment_id_t segment_id, char *buf,
                        size_t len);
/* Handshake probe (message type 3) to the owner of an opened segment. */
int mc_segment_probe(transfer_engine_t engine, segment_id_t segment_id);

/* Waits until no transfer (ours or a peer's) touches the registered buffer
 * that starts at `addr`. timeout_ms < 0 waits forever. 0 when idle,
 * MC_ERR_TIMEOUT on timeout, ERR_ADDRESS_NOT_REGISTERED if unknown. */
int mc_wait_region_idle(transfer_engine_t engine, void *addr, int64_t timeout_ms);

/* Waits until every task submitted to the batch so far is terminal.
 * timeout_ms < 0 waits forever. 0 when done, MC_ERR_TIMEOUT otherwise.
 * Tasks seen terminal count as observed (for freeBatchID). */
int mc_batch_wait(transfer_engine_t engine, batch_id_t batch_id, int64_t timeout_ms);
/* Readiness for async callers, without polling. The first call turns it on
 * (blocking callers never pay for it) and returns an eventfd that the engine
 * owns (non-blocking, close-on-exec; do not close it; valid until the
 * engine is destroyed). It is readable once a batch's submitted tasks have
 * all finished, or a notification arrived, since the caller last took the
 * completions. Read it (8 bytes), then call mc_engine_take_completions,
 * then drain notifications: another order can miss an event. */
int mc_engine_event_fd(transfer_engine_t engine, int *fd);
/* Moves up to `cap` ids of batches that finished since the last call
 * (oldest first; only while the event fd is on) into `ids`; *n = how many.
 * *overflowed = 1 when ids were dropped (more than 65,536 waiting): check
 * every batch you wait for. A listed batch may have had tasks submitted
 * after it finished, and a batch finishes once per submit at most: confirm
 * with mc_batch_wait(engine, id, 0), which also sends its notify. While ids
 * remain (cap was smaller), the fd stays readable. */
int mc_engine_take_completions(transfer_engine_t engine, batch_id_t *ids, size_t cap, size_t *n,
                               int *overflowed);
/* Empties a batch for reuse (same id, same capacity) once every submitted
 * task has been seen terminal (after mc_batch_wait or statuses). Returns
 * MC_STATUS_OK, or MC_STATUS_BATCH_BUSY / MC_STATUS_INVALID_ARGUMENT like
 * freeBatchID. Reusing a batch allocates nothing. */
int mc_batch_reset(transfer_engine_t engine, batch_id_t batch_id);
/* Block-list transfers. A KV transfer moves the same block ids in every
 * layer's tensor; naming regions and ids once costs the caller and the
 * engine per region and per id, where one request per block costs per
 * region x id (131,072 requests for a 32k-token prompt of a 32-layer model
 * with separate K and V tensors and 16-token blocks).
 * Block k of a region is block_len bytes at local_base + k * local_stride
 * here and at remote_base + k * remote_stride in the target segment. */
typedef struct mc_block_region {
    uint64_t local_base;    /* local address of block 0 */
    uint64_t remote_base;   /* address of block 0 in the target segment */
    uint64_t local_stride;  /* bytes from one local block to the next */
    uint64_t remote_stride; /* bytes from one remote block to the next */
    uint64_t block_len;     /* bytes moved per block */
} mc_block_region_t;
/* Submits, as ONE task of the batch, for every region r and every
 * i < num_blocks: local block local_ids[i] of r and remote block
 * remote_ids[i] of r (OPCODE_READ: remote -> local, OPCODE_WRITE: local ->
 * remote). *task (may be NULL) = the task's index: its status turns
 * COMPLETED when every piece has, FAILED when any failed (with that
 * piece's reason); transferred bytes count every piece.
 * Limits: 1 to 65,536 regions, at most 2^24 pieces (regions x ids); the
 * destination ids distinct and, with more than one id, the destination
 * stride at least block_len; every region's local blocks inside one
 * registered buffer. Pieces run in any order. Returns MC_STATUS_* as
 * submitTransfer, with a message naming the cause. Peer addresses are
 * checked as requests' are; where the peer's GPU memory is mapped here
 * (CUDA IPC) the whole list is one kernel launch. */
int mc_submit_blocks(transfer_engine_t engine, batch_id_t batch_id, int opcode, segment_id_t target_id,
                     const mc_block_region_t *regions, size_t num_regions, const uint64_t *local_ids,
                     const uint64_t *remote_ids, size_t num_blocks, size_t *task);

/* Statuses of the first `cap` tasks into `out`; *count = tasks submitted. */
int mc_batch_status(transfer_engine_t engine, batch_id_t batch_id,
                    struct transfer_status *out, size_t cap, size_t *count);
/* Why a FAILED task failed, NUL-terminated (empty when it did not fail). */
int mc_transfer_error(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      char *buf, size_t len, size_t *needed);

/* Engine-allocated ("managed") buffers, as upstream's Python binding
 * offers (allocate_managed_buffer / free_managed_buffer): `length` bytes,
 * page-aligned and zeroed, registered with the engine (remote-accessible,
 * `location` as for registerLocalMemory; NULL = "*"). Free with
 * mc_managed_buffer_free and the same length; it waits for transfers that
 * touch the buffer. Buffers still allocated go with the engine.
 * ERR_ADDRESS_NOT_REGISTERED when `addr` is not a managed buffer of this
 * engine, ERR_INVALID_ARGUMENT when the length differs. */
int mc_managed_buffer_alloc(transfer_engine_t engine, size_t length, const char *location,
                            void **out);
int mc_managed_buffer_free(transfer_engine_t engine, void *addr, size_t length);

/* One synchronous transfer, as upstream's Python transfer_sync_read /
 * transfer_sync_write: opens `target_segment` (cached by name), moves
 * `length` bytes between `local` (inside registered memory) and the
 * target's address `remote_addr` (OPCODE_READ: into local; OPCODE_WRITE:
 * from local) and returns once the request is terminal (the transports'
 * timeouts bound the wait). 0 when it completed, MC_ERR_TRANSFER_FAILED
 * with the reason when it failed, or the error of the open or submit. */
int mc_transfer_sync(transfer_engine_t engine, const char *target_segment, int opcode, void *local,
                     uint64_t remote_addr, uint64_t length);

/* The transports installed now, as MC_PROTOCOL_* bits (createTransferEngine
 * with auto_discover picks RDMA or TCP; uninstallTransport removes one). */
int mc_engine_transports(transfer_engine_t engine, uint32_t *protocols);

/* What an engine has done so far, by path. */
typedef struct mc_engine_counters {
    uint64_t tcp_requests_sent;     /* as initiator */
    uint64_t tcp_requests_served;   /* as target */
    uint64_t tcp_requests_rejected; /* as target: outside every buffer */
    uint64_t ipc_copies;            /* same-host GPU path, as initiator */
    uint64_t local_copies;          /* LOCAL_SEGMENT transfers */
    uint64_t same_host_requests;    /* as initiator: moved by the same-host CPU path */
    uint64_t same_host_served;      /* as target: same-host copies done for peers */
} mc_engine_counters_t;
int mc_engine_get_counters(transfer_engine_t engine, mc_engine_counters_t *out);

/* What an engine's listeners have refused so far (own struct, so that
 * mc_engine_counters_t keeps its size for existing callers). */
typedef struct mc_engine_limit_counters {
    uint64_t tcp_connections_refused;     /* data port: allow-list or caps */
    uint64_t tcp_connections_idle_closed; /* data port: idle deadlines */
    uint64_t handshake_connections_refused; /* allow-list, cap, or shed */
    uint64_t notifications_refused;       /* over the size or byte budget */
    uint64_t notification_bytes_queued;   /* now, not yet drained */
} mc_engine_limit_counters_t;
int mc_engine_get_limit_counters(transfer_engine_t engine, mc_engine_limit_counters_t *out);

/* Batch bookkeeping so far: tasks accepted by submits, and task statuses
 * handed to callers (one per task per read, by getTransferStatus or
 * mc_batch_status). A caller that reads each status about once shows
 * reads ~ tasks; one that re-reads a prefix per task shows reads ~ tasks^2/2. */
typedef struct mc_engine_batch_counters {
    uint64_t tasks_submitted;
    uint64_t task_status_reads;
} mc_engine_batch_counters_t;
int mc_engine_get_batch_counters(transfer_engine_t engine, mc_engine_batch_counters_t *out);

/* GPU support. In a CPU build, or without a usable GPU and driver, the
 * calls below fail with ERR_NOT_IMPLEMENTED / ERR_CONTEXT and a message that
 * names the build's CUDA major and the driver's version. */
typedef struct mc_gpu_info {
    int32_t build_cuda_major; /* 12, 13, or 0 for a CPU build */
    int32_t runtime_version;  /* statically linked runtime, e.g. 12090 */
    int32_t driver_version;   /* e.g. 13000; 0 without a driver */
    int32_t device_count;
    int32_t usable;           /* 1 when GPU memory can be used */
} mc_gpu_info_t;
/* `reason` (may be NULL) receives why the GPU is unusable, or "". */
int mc_gpu_query(mc_gpu_info_t *info, char *reason, size_t reason_len);
int mc_gpu_alloc(int device, size_t size, void **ptr);
int mc_gpu_free(int device, void *ptr);
int mc_gpu_alloc_pinned(size_t size, void **ptr);
int mc_gpu_free_pinned(void *ptr);
/* Synchronous copy between any host and device memory. */
int mc_gpu_memcpy(void *dst, const void *src, size_t size);
int mc_gpu_memset(int device, void *ptr, int value, size_t size);
/* Where a pointer lives: *device = GPU ordinal, or -1 for host memory. */
int mc_gpu_pointer_device(const void *ptr, int32_t *device);

typedef struct mc_dmabuf {
    int32_t fd;      /* owned by the caller: close() it */
    int32_t device;
    uint64_t offset; /* of the pointer inside the exported allocation */
    uint64_t base;   /* allocation start */
    uint64_t size;   /* allocation size */
} mc_dmabuf_t;
/* DMA-BUF export of the device allocation holding [ptr, ptr+size), as used
 * for RDMA registration with WITH_NVIDIA_PEERMEM=0. */
int mc_gpu_dmabuf_export(const void *ptr, size_t size, mc_dmabuf_t *out);
int mc_gpu_dmabuf_supported(int device, int32_t *supported);

/* ABI self-description: one entry per field of every struct shared with
 * bindings, so that a binding can check its own layout at test time. */
typedef struct mc_abi_field {
    const char *type_name;
    const char *field_name; /* "" for the whole struct */
    size_t offset;
    size_t size;
} mc_abi_field_t;
size_t mc_abi_describe(const mc_abi_field_t **fields);

#ifdef __cplusplus
}
#endif

#endif /* MOONCAKE_RS_EXT_H */
