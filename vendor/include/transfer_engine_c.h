/*
 * transfer_engine_c.h - C ABI of the mooncake-rs transfer engine.
 *
 * The function names, signatures, struct layouts, constants and return
 * conventions follow the C API of upstream Mooncake's classic transfer
 * engine (release 0.3.13), so that code written against that header links
 * against this engine unchanged. The implementation behind it is our own.
 *
 * Conventions (inherited from upstream, kept for compatibility):
 *  - Strings passed in are copied; the caller may free them after the call.
 *  - Functions returning `int` that wrap engine operations return 0 or a
 *    negative ERR_* value (see mooncake_ext.h for the list).
 *  - submitTransfer, submitTransferWithNotify, getTransferStatus and
 *    freeBatchID return a non-negative status code instead (0 = ok,
 *    1 = invalid argument, 2 = too many requests, 3 = address not
 *    registered, 4 = batch busy, 8 = transport not supported, ...).
 *  - Every failing call records a message for the calling thread, readable
 *    with mc_last_error_message() from mooncake_ext.h.
 *  - No C++ exception ever leaves these functions.
 */
#ifndef MOONCAKE_RS_TRANSFER_ENGINE_C_H
#define MOONCAKE_RS_TRANSFER_ENGINE_C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

/* One transfer. `target_offset` is the absolute virtual address inside the
 * target segment's process, not an offset. Layout (x86-64): opcode @0,
 * source @8, target_id @16, target_offset @24, length @32; size 40. */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};
typedef struct transfer_status transfer_status_t;

/* Kept for layout compatibility; no function of this header uses it. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
typedef struct segment_desc segment_desc_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

typedef void *transfer_engine_t;
typedef void *transport_t;

/* Engine lifetime. Returns NULL when initialisation fails; the reason is
 * available from mc_last_error_message(). */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);
void destroyTransferEngine(transfer_engine_t engine);

int discoverTopology(transfer_engine_t engine);
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

transport_t installTransport(transfer_engine_t engine, const char *proto,
                             void **args);
int uninstallTransport(transfer_engine_t engine, const char *proto);

/* Remote segments. Return a segment id (>= 1), or -1 on failure. */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);
segment_id_t openSegmentNoCache(transfer_engine_t engine,
                                const char *segment_name);
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);
int syncSegmentCache(transfer_engine_t engine);
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

/* Local memory. */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
                        const char *location, int remote_accessible);
int unregisterLocalMemory(transfer_engine_t engine, void *addr);
int registerLocalMemoryBatch(transfer_engine_t engine,
                             buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location);
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list,
                               size_t addr_len);

/* Batches. */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                   struct transfer_request *entries, size_t count);
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
                      size_t task_id, struct transfer_status *status);
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* Notifications. */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);
int freeNotifsMsgBuf(notify_msg_t *msg, int size);
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id,
                      notify_msg_t notify_msg);

/* Diagnostics. */
/* Per-NIC load of the RDMA transport: fills up to *count entries and sets
 * *count to the number of NICs (0 without RDMA). 0 on success, -1 for a
 * null argument. */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats,
                    size_t *count);
void enableGracefulShutdown(transfer_engine_t engine);
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len,
              int json);

#ifdef __cplusplus
}
#endif

#endif /* MOONCAKE_RS_TRANSFER_ENGINE_C_H */
