/*
 * Header compatibility with upstream Mooncake's transfer_engine_c.h.
 *
 * Written the way a C program of upstream's users is: every function is
 * taken into a pointer of the exact type upstream declares, every struct
 * field, typedef, constant and status value is used, and the layouts are
 * checked. Built with -std=c11 -Wall -Wextra -Werror by `make test`, so a
 * declaration of ours that drifts from upstream's breaks the build. main()
 * then drives a few of the calls against the library: one engine, a
 * transfer within its own segment, the diagnostics.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transfer_engine_c.h"

/* Upstream's declarations, as function pointer types. */
typedef transfer_engine_t (*create_fn)(const char *, const char *, const char *, uint64_t, int);
typedef int (*engine_fn)(transfer_engine_t);
typedef int (*ip_port_fn)(transfer_engine_t, char *, size_t);
typedef transport_t (*install_fn)(transfer_engine_t, const char *, void **);
typedef int (*by_name_fn)(transfer_engine_t, const char *);
typedef segment_id_t (*open_fn)(transfer_engine_t, const char *);
typedef int (*close_fn)(transfer_engine_t, segment_id_t);
typedef void (*destroy_fn)(transfer_engine_t);
typedef int (*register_fn)(transfer_engine_t, void *, size_t, const char *, int);
typedef int (*unregister_fn)(transfer_engine_t, void *);
typedef int (*register_batch_fn)(transfer_engine_t, buffer_entry_t *, size_t, const char *);
typedef int (*unregister_batch_fn)(transfer_engine_t, void **, size_t);
typedef batch_id_t (*alloc_batch_fn)(transfer_engine_t, size_t);
typedef int (*submit_fn)(transfer_engine_t, batch_id_t, struct transfer_request *, size_t);
typedef int (*submit_notify_fn)(transfer_engine_t, batch_id_t, struct transfer_request *, size_t,
                                notify_msg_t);
typedef notify_msg_t *(*get_notifs_fn)(transfer_engine_t, int *);
typedef int (*free_notifs_fn)(notify_msg_t *, int);
typedef int (*gen_notify_fn)(transfer_engine_t, uint64_t, notify_msg_t);
typedef int (*status_fn)(transfer_engine_t, batch_id_t, size_t, struct transfer_status *);
typedef int (*free_batch_fn)(transfer_engine_t, batch_id_t);
typedef int (*nic_stats_fn)(transfer_engine_t, nic_load_stat_t *, size_t *);
typedef void (*graceful_fn)(transfer_engine_t);
typedef int (*show_links_fn)(transfer_engine_t, char *, size_t, int);

/* Every function of upstream's header, with its type checked by the
 * initialisation (a mismatch is an incompatible-pointer error). */
static const struct {
    create_fn create;
    engine_fn discover;
    ip_port_fn ip_port;
    install_fn install;
    by_name_fn uninstall;
    open_fn open, open_no_cache;
    close_fn close;
    by_name_fn warmup, remove_local;
    destroy_fn destroy;
    register_fn reg;
    unregister_fn unreg;
    register_batch_fn reg_batch;
    unregister_batch_fn unreg_batch;
    alloc_batch_fn alloc_batch;
    submit_fn submit;
    submit_notify_fn submit_notify;
    get_notifs_fn get_notifs;
    free_notifs_fn free_notifs;
    gen_notify_fn gen_notify;
    status_fn status;
    free_batch_fn free_batch;
    engine_fn sync_cache;
    nic_stats_fn nic_stats;
    graceful_fn graceful;
    show_links_fn show_links;
} api = {
    createTransferEngine, discoverTopology, getLocalIpAndPort, installTransport, uninstallTransport,
    openSegment, openSegmentNoCache, closeSegment, warmupEfaSegment, removeLocalSegment,
    destroyTransferEngine, registerLocalMemory, unregisterLocalMemory, registerLocalMemoryBatch,
    unregisterLocalMemoryBatch, allocateBatchID, submitTransfer, submitTransferWithNotify,
    getNotifsFromEngine, freeNotifsMsgBuf, genNotifyInEngine, getTransferStatus, freeBatchID,
    syncSegmentCache, getNicLoadStats, enableGracefulShutdown, showLinks,
};

/* Types and constants. */
_Static_assert(sizeof(segment_id_t) == 4 && sizeof(segment_handle_t) == 4, "segment ids are int32_t");
_Static_assert((segment_id_t)-1 < 0 && (segment_handle_t)-1 < 0, "segment ids are signed");
_Static_assert(sizeof(batch_id_t) == 8 && (batch_id_t)-1 > 0, "batch ids are uint64_t");
_Static_assert(LOCAL_SEGMENT == 0 && INVALID_BATCH == UINT64_MAX, "segment/batch constants");
_Static_assert(OPCODE_READ == 0 && OPCODE_WRITE == 1, "opcodes");
_Static_assert(STATUS_WAITING == 0 && STATUS_PENDING == 1 && STATUS_INVALID == 2 && STATUS_CANCELED == 3 &&
                   STATUS_COMPLETED == 4 && STATUS_TIMEOUT == 5 && STATUS_FAILED == 6,
               "status values");
_Static_assert(sizeof(transfer_engine_t) == sizeof(void *) && sizeof(transport_t) == sizeof(void *),
               "opaque handles");

/* Layouts (LP64, as upstream builds them). */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(offsetof(struct transfer_request, opcode) == 0 && offsetof(transfer_request_t, source) == 8 &&
                   offsetof(transfer_request_t, target_id) == 16 &&
                   offsetof(transfer_request_t, target_offset) == 24 && offsetof(transfer_request_t, length) == 32 &&
                   sizeof(transfer_request_t) == 40,
               "transfer_request layout");
_Static_assert(offsetof(struct transfer_status, status) == 0 &&
                   offsetof(transfer_status_t, transferred_bytes) == 8 && sizeof(transfer_status_t) == 16,
               "transfer_status layout");
_Static_assert(offsetof(struct notify_msg, name) == 0 && offsetof(notify_msg_t, msg) == 8 &&
                   sizeof(notify_msg_t) == 16,
               "notify_msg layout");
_Static_assert(offsetof(struct buffer_entry, addr) == 0 && offsetof(buffer_entry_t, length) == 8 &&
                   sizeof(buffer_entry_t) == 16,
               "buffer_entry layout");
_Static_assert(offsetof(struct nic_load_stat, device_name) == 0 && sizeof(((nic_load_stat_t *)0)->device_name) == 64 &&
                   offsetof(nic_load_stat_t, inflight_bytes) == 64 &&
                   offsetof(nic_load_stat_t, ewma_bandwidth_bps) == 72 && sizeof(nic_load_stat_t) == 80,
               "nic_load_stat layout");
_Static_assert(offsetof(struct segment_desc, type) == 0 && offsetof(segment_desc_t, desc_) == 8 &&
                   offsetof(segment_desc_t, desc_.rdma.addr) == 8 && offsetof(segment_desc_t, desc_.rdma.size) == 16 &&
                   offsetof(segment_desc_t, desc_.rdma.location) == 24 &&
                   offsetof(segment_desc_t, desc_.nvmeof.file_path) == 8 &&
                   offsetof(segment_desc_t, desc_.nvmeof.subsystem_name) == 16 &&
                   offsetof(segment_desc_t, desc_.nvmeof.proto) == 24 &&
                   offsetof(segment_desc_t, desc_.nvmeof.ip) == 32 &&
                   offsetof(segment_desc_t, desc_.nvmeof.port) == 40 && sizeof(segment_desc_t) == 48,
               "segment_desc layout");
#endif

/* Every field, written and read with its upstream type. */
static int use_every_field(void) {
    char name[] = "n", msg[] = "m", path[] = "/dev/x";
    int x = 0;
    struct transfer_request r = {OPCODE_WRITE, &x, LOCAL_SEGMENT, (uint64_t)0, (uint64_t)4};
    transfer_request_t r2 = r;
    struct notify_msg n = {name, msg};
    notify_msg_t n2 = n;
    struct transfer_status st = {STATUS_PENDING, (uint64_t)0};
    transfer_status_t st2 = st;
    struct buffer_entry b = {&x, sizeof x};
    buffer_entry_t b2 = b;
    struct nic_load_stat nic = {{0}, (uint64_t)1, 2.0};
    nic_load_stat_t nic2 = nic;
    struct segment_desc sd;
    segment_desc_t sd2;
    segment_handle_t h = LOCAL_SEGMENT;
    sd.type = 0;
    sd.desc_.rdma.addr = &x;
    sd.desc_.rdma.size = (uint64_t)sizeof x;
    sd.desc_.rdma.location = "cpu:0";
    sd2 = sd;
    sd2.desc_.nvmeof.file_path = path;
    sd2.desc_.nvmeof.subsystem_name = "s";
    sd2.desc_.nvmeof.proto = "tcp";
    sd2.desc_.nvmeof.ip = "127.0.0.1";
    sd2.desc_.nvmeof.port = (uint64_t)4420;
    memcpy(nic2.device_name, "mlx5_0", 7);
    return (r2.opcode == OPCODE_WRITE && r2.source == &x && r2.target_id == h && r2.target_offset == 0 &&
            r2.length == 4 && n2.name[0] == 'n' && n2.msg[0] == 'm' && st2.status == STATUS_PENDING &&
            st2.transferred_bytes == 0 && b2.addr == &x && b2.length == sizeof x && nic2.inflight_bytes == 1 &&
            nic2.ewma_bandwidth_bps == 2.0 && nic2.device_name[0] == 'm' && sd.type == 0 &&
            sd.desc_.rdma.size == sizeof x && sd2.desc_.nvmeof.port == 4420)
               ? 0
               : 1;
}

static int failures = 0;
#define EXPECT(cond)                                                          \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "upstream_header_use: FAILED %s (line %d)\n", #cond, __LINE__); \
            ++failures;                                                       \
        }                                                                     \
    } while (0)

/* A transfer within the engine's own segment, the way upstream's users
 * drive a batch: allocate, submit, poll each task, free. */
static void local_transfer(transfer_engine_t e) {
    static char src[4096], dst[4096];
    buffer_entry_t bufs[2] = {{src, sizeof src}, {dst, sizeof dst}};
    memset(src, 0x5a, sizeof src);
    EXPECT(api.reg_batch(e, bufs, 2, "cpu:0") == 0);
    batch_id_t b = api.alloc_batch(e, 1);
    EXPECT(b != INVALID_BATCH);
    struct transfer_request r = {OPCODE_WRITE, src, LOCAL_SEGMENT, (uint64_t)(uintptr_t)dst, sizeof src};
    EXPECT(api.submit(e, b, &r, 1) == 0);
    struct transfer_status st = {STATUS_WAITING, 0};
    for (int i = 0; i < 100000; ++i) {
        EXPECT(api.status(e, b, 0, &st) == 0);
        if (st.status == STATUS_COMPLETED || st.status == STATUS_FAILED || st.status == STATUS_TIMEOUT) break;
    }
    EXPECT(st.status == STATUS_COMPLETED && st.transferred_bytes == sizeof src);
    EXPECT(memcmp(src, dst, sizeof src) == 0);
    EXPECT(api.free_batch(e, b) == 0);
    void *addrs[2] = {src, dst};
    EXPECT(api.unreg_batch(e, addrs, 2) == 0);
}

int main(void) {
    EXPECT(use_every_field() == 0);
    transfer_engine_t e = api.create("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
    EXPECT(e != NULL);
    if (!e) return 1;
    EXPECT(api.install(e, "tcp", NULL) != NULL);
    char where[64];
    EXPECT(api.ip_port(e, where, sizeof where) == 0 && strncmp(where, "127.0.0.1:", 10) == 0);
    local_transfer(e);
    nic_load_stat_t stats[2];
    size_t count = 2;
    EXPECT(api.nic_stats(e, stats, &count) == 0 && count == 0); /* TCP only: no NICs */
    char links[4096];
    EXPECT(api.show_links(e, links, sizeof links, 1) == 0 && strstr(links, "\"tcp\"") != NULL);
    batch_id_t empty = api.alloc_batch(e, 0);
    EXPECT(empty != INVALID_BATCH && api.free_batch(e, empty) == 0);
    int n = -1;
    EXPECT(api.get_notifs(e, &n) == NULL && n == 0);
    EXPECT(api.open(e, "") == -1);
    EXPECT(api.sync_cache(e) == 0);
    api.graceful(e);
    api.destroy(e);
    if (failures == 0) printf("upstream_header_use: every upstream declaration compiled; calls passed\n");
    return failures == 0 ? 0 : 1;
}
