// The upstream-compatible C ABI (transfer_engine_c.h). Each function is a
// thin adapter over TransferEngine wrapped in an exception barrier.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "capi/api_guard.h"
#include "common/text.h"
#include "common/host_port.h"
#include "core/request.h"
#include "transport/rdma/rdma_transport.h"
#include "transfer_engine_c.h"

using namespace mcrs;

static_assert(OPCODE_READ == kOpRead && OPCODE_WRITE == kOpWrite && LOCAL_SEGMENT == kLocalSegment,
              "the public constants and the engine's agree");

namespace {

// The public requests as the engine's own type, in a per-thread buffer (no
// allocation once warm). Null stays null: the engine names that error. A
// count the batch has no room for is refused before anything is read.
const Request *engine_requests(TransferEngine *e, batch_id_t batch_id, const transfer_request *entries,
                               size_t count) {
    if (!entries || count == 0) return nullptr;  // submit reads nothing then
    e->check_room(batch_id, count);
    thread_local std::vector<Request> out;
    out.resize(count);
    for (size_t i = 0; i < count; ++i)
        out[i] = Request{entries[i].opcode, entries[i].source, entries[i].target_id, entries[i].target_offset,
                         entries[i].length};
    return out.data();
}

// installTransport returns an opaque, stable, non-null token per protocol.
char g_tcp_transport_token;
char g_rdma_transport_token;

std::string str_or(const char *s, const char *dflt) { return s ? std::string(s) : std::string(dflt); }
}  // namespace

extern "C" {

transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name, uint64_t rpc_port,
                                       int auto_discover) {
    // Like upstream: in P2PHANDSHAKE mode the host comes from
    // local_server_name and the RPC port is random (or, with
    // MC_LEGACY_RPC_PORT_BINDING, the port in local_server_name);
    // ip_or_host_name and rpc_port are not used.
    (void)ip_or_host_name;
    (void)rpc_port;
    return guard_value<transfer_engine_t>("createTransferEngine", nullptr, [&]() -> transfer_engine_t {
        if (!metadata_conn_string)
            throw Error(kErrInvalidArgument, "metadata_conn_string is null");
        if (!local_server_name) throw Error(kErrInvalidArgument, "local_server_name is null");
        EngineConfig cfg = EngineConfig::from_env();
        cfg.metadata_conn_string = metadata_conn_string;
        cfg.local_server_name = local_server_name;
        cfg.protocols = 0;
        if (ProcessOverrides::from_env().legacy_rpc_port_binding)
            cfg.rpc_port = parse_host_port(local_server_name).port;
        auto e = std::make_unique<TransferEngine>(cfg);
        // Upstream's auto-discovery: RDMA when a usable NIC exists, else TCP.
        if (auto_discover) e->install_auto_transport();
        return e.release();
    });
}

void destroyTransferEngine(transfer_engine_t engine) {
    guard_errcode("destroyTransferEngine", [&] {
        delete static_cast<TransferEngine *>(engine);
        return 0;
    });
}

int discoverTopology(transfer_engine_t engine) {
    return guard_errcode("discoverTopology", [&]() -> int {
        engine_of(engine, "discoverTopology")->discover_topology();
        return 0;
    });
}

int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len) {
    return guard_errcode("getLocalIpAndPort", [&] {
        TransferEngine *e = engine_of(engine, "getLocalIpAndPort");
        if (!buf_out || buf_len == 0) throw Error(kErrInvalidArgument, "output buffer is empty");
        // Like upstream: IPv6 hosts are not bracketed here, and the copy
        // truncates.
        std::string s = e->local_host() + ":" + std::to_string(e->rpc_port());
        std::snprintf(buf_out, buf_len, "%s", s.c_str());
        return 0;
    });
}

transport_t installTransport(transfer_engine_t engine, const char *proto, void **args) {
    // args[0] (rdma): a priority matrix as a JSON C string, as upstream.
    return guard_value<transport_t>("installTransport", nullptr, [&]() -> transport_t {
        TransferEngine *e = engine_of(engine, "installTransport");
        if (!proto) throw Error(kErrInvalidArgument, "protocol is null");
        std::string topo;
        if (args && args[0] && std::string(proto) == "rdma") topo = static_cast<const char *>(args[0]);
        e->install_transport(proto, topo);
        return std::string(proto) == "rdma" ? &g_rdma_transport_token : &g_tcp_transport_token;
    });
}

int uninstallTransport(transfer_engine_t engine, const char *proto) {
    return guard_errcode("uninstallTransport", [&]() -> int {
        TransferEngine *e = engine_of(engine, "uninstallTransport");
        if (!proto) throw Error(kErrInvalidArgument, "protocol is null");
        e->uninstall_transport(proto);
        return 0;
    });
}

segment_id_t openSegment(transfer_engine_t engine, const char *segment_name) {
    return guard_value<segment_id_t>("openSegment", -1, [&] {
        if (!segment_name) throw Error(kErrInvalidArgument, "segment name is null");
        return engine_of(engine, "openSegment")->open_segment(segment_name, false);
    });
}

segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name) {
    return guard_value<segment_id_t>("openSegmentNoCache", -1, [&] {
        if (!segment_name) throw Error(kErrInvalidArgument, "segment name is null");
        return engine_of(engine, "openSegmentNoCache")->open_segment(segment_name, true);
    });
}

int closeSegment(transfer_engine_t engine, segment_id_t segment_id) {
    return guard_errcode("closeSegment", [&] {
        engine_of(engine, "closeSegment")->close_segment(segment_id);
        return 0;
    });
}

int removeLocalSegment(transfer_engine_t engine, const char *segment_name) {
    return guard_errcode("removeLocalSegment", [&] {
        if (!segment_name) throw Error(kErrInvalidArgument, "segment name is null");
        engine_of(engine, "removeLocalSegment")->remove_cached_segment(segment_name);
        return 0;
    });
}

int syncSegmentCache(transfer_engine_t engine) {
    return guard_errcode("syncSegmentCache", [&] {
        auto r = engine_of(engine, "syncSegmentCache")->sync_segment_cache();
        if (r.first != 0) throw Error(r.first, r.second);
        return 0;
    });
}

int warmupEfaSegment(transfer_engine_t engine, const char *segment_name) {
    return guard_errcode("warmupEfaSegment", [&]() -> int {
        engine_of(engine, "warmupEfaSegment");
        throw Error(kErrNotImplemented, "cannot warm up segment '" + str_or(segment_name, "") +
                                            "': this engine has no EFA transport (only 'tcp' and 'rdma')");
    });
}

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible) {
    return guard_errcode("registerLocalMemory", [&] {
        engine_of(engine, "registerLocalMemory")
            ->register_memory(addr, length, str_or(location, "*"), remote_accessible != 0);
        return 0;
    });
}

int unregisterLocalMemory(transfer_engine_t engine, void *addr) {
    return guard_errcode("unregisterLocalMemory", [&] {
        engine_of(engine, "unregisterLocalMemory")->unregister_memory(addr);
        return 0;
    });
}

int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
                             size_t buffer_len, const char *location) {
    return guard_errcode("registerLocalMemoryBatch", [&] {
        TransferEngine *e = engine_of(engine, "registerLocalMemoryBatch");
        if (buffer_len > 0 && !buffer_list) throw Error(kErrInvalidArgument, "buffer list is null");
        std::vector<RegionInfo> rs;
        rs.reserve(buffer_len);
        for (size_t i = 0; i < buffer_len; ++i)
            rs.push_back(RegionInfo{reinterpret_cast<uint64_t>(buffer_list[i].addr),
                                    buffer_list[i].length, true, str_or(location, "*")});
        e->register_memory_batch(rs);
        return 0;
    });
}

int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len) {
    return guard_errcode("unregisterLocalMemoryBatch", [&] {
        TransferEngine *e = engine_of(engine, "unregisterLocalMemoryBatch");
        if (addr_len > 0 && !addr_list) throw Error(kErrInvalidArgument, "address list is null");
        // Best effort: try every address, report the first failure.
        int first = 0;
        std::string msg;
        for (size_t i = 0; i < addr_len; ++i) {
            try {
                e->unregister_memory(addr_list[i]);
            } catch (const Error &err) {
                if (first == 0) {
                    first = err.code();
                    msg = err.what();
                }
            }
        }
        if (first != 0) throw Error(first, msg);
        return 0;
    });
}

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size) {
    return guard_value<batch_id_t>("allocateBatchID", INVALID_BATCH, [&] {
        return engine_of(engine, "allocateBatchID")->allocate_batch(batch_size);
    });
}

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count) {
    return guard_status("submitTransfer", [&] {
        TransferEngine *e = engine_of(engine, "submitTransfer");
        e->submit(batch_id, engine_requests(e, batch_id, entries, count), count, nullptr);
        return 0;
    });
}

int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg) {
    return guard_status("submitTransferWithNotify", [&] {
        TransferEngine *e = engine_of(engine, "submitTransferWithNotify");
        if (count == 0 || !entries)
            throw StatusError(kStatusInvalidArgument, "a notify needs at least one request");
        PendingNotify n;
        n.segment_id = entries[0].target_id;
        n.name = str_or(notify_msg.name, "");
        n.msg = str_or(notify_msg.msg, "");
        e->submit(batch_id, engine_requests(e, batch_id, entries, count), count, &n);
        return 0;
    });
}

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status) {
    return guard_status("getTransferStatus", [&] {
        TransferEngine *e = engine_of(engine, "getTransferStatus");
        if (!status) throw StatusError(kStatusInvalidArgument, "status pointer is null");
        uint64_t bytes = 0;
        int s = e->task_status(batch_id, task_id, &bytes);
        status->status = s;
        status->transferred_bytes = bytes;
        return 0;
    });
}

int freeBatchID(transfer_engine_t engine, batch_id_t batch_id) {
    return guard_status("freeBatchID", [&] {
        engine_of(engine, "freeBatchID")->free_batch(batch_id);
        return 0;
    });
}

notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size) {
    return guard_value<notify_msg_t *>("getNotifsFromEngine", nullptr, [&]() -> notify_msg_t * {
        if (size) *size = 0;
        TransferEngine *e = engine_of(engine, "getNotifsFromEngine");
        if (!size) throw Error(kErrInvalidArgument, "size pointer is null");
        auto list = e->drain_notifications();
        if (list.empty()) return nullptr;
        auto *out = static_cast<notify_msg_t *>(std::calloc(list.size(), sizeof(notify_msg_t)));
        if (!out) throw std::bad_alloc();
        for (size_t i = 0; i < list.size(); ++i) {
            out[i].name = strdup(list[i].name.c_str());
            out[i].msg = strdup(list[i].msg.c_str());
            if (!out[i].name || !out[i].msg) {
                for (size_t j = 0; j <= i; ++j) {
                    std::free(out[j].name);
                    std::free(out[j].msg);
                }
                std::free(out);
                throw std::bad_alloc();
            }
        }
        *size = static_cast<int>(list.size());
        return out;
    });
}

int freeNotifsMsgBuf(notify_msg_t *msg, int size) {
    return guard_errcode("freeNotifsMsgBuf", [&] {
        if (!msg) return 0;
        for (int i = 0; i < size; ++i) {
            std::free(msg[i].name);
            std::free(msg[i].msg);
        }
        std::free(msg);
        return 0;
    });
}

int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg) {
    return guard_errcode("genNotifyInEngine", [&] {
        TransferEngine *e = engine_of(engine, "genNotifyInEngine");
        if (target_id > static_cast<uint64_t>(INT32_MAX))
            throw Error(kErrMetadata, "segment id " + std::to_string(target_id) + " is out of range");
        e->send_notify(static_cast<int32_t>(target_id), str_or(notify_msg.name, ""),
                       str_or(notify_msg.msg, ""));
        return 0;
    });
}

int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count) {
    // Like upstream: -1 for a null argument; otherwise up to *count entries
    // are filled and *count becomes the number of NICs (more than were
    // filled when the array was short). No RDMA transport: 0 NICs.
    if (!engine || !stats || !count) {
        set_last_error(kErrInvalidArgument, std::string("getNicLoadStats: ") +
                                                (!engine ? "engine handle" : !stats ? "stats" : "count") +
                                                " is null");
        return -1;
    }
    return guard_status("getNicLoadStats", [&] {
        auto t = static_cast<TransferEngine *>(engine)->rdma();
        if (!t) {
            *count = 0;
            return 0;
        }
        auto nics = t->counters();
        for (size_t i = 0; i < nics.size() && i < *count; ++i) {
            std::snprintf(stats[i].device_name, sizeof stats[i].device_name, "%s", nics[i].name.c_str());
            stats[i].inflight_bytes = nics[i].inflight_bytes;
            stats[i].ewma_bandwidth_bps = nics[i].ewma_bps;
        }
        *count = nics.size();
        return 0;
    });
}

void enableGracefulShutdown(transfer_engine_t engine) {
    guard_errcode("enableGracefulShutdown", [&] {
        engine_of(engine, "enableGracefulShutdown")->enable_graceful_shutdown();
        return 0;
    });
}

int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json) {
    // Like upstream: -1 without an engine or output buffer; the copy
    // truncates (NUL-terminated).
    return guard_errcode("showLinks", [&] {
        TransferEngine *e = engine_of(engine, "showLinks");
        if (!buf_out || buf_len == 0) throw Error(kErrInvalidArgument, "output buffer is empty");
        std::string s = e->show_links(json != 0);
        std::snprintf(buf_out, buf_len, "%s", s.c_str());
        return 0;
    });
}

}  // extern "C"
