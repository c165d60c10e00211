// The engine: one local segment (registered memory served to peers), the
// handshake listener, the installed transports, remote segments and batches.
// Every public method is safe to call from many threads at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/host_port.h"
#include "common/json.h"
#include "common/peer_filter.h"
#include "core/batch.h"
#include "core/config.h"
#include "core/memory_registry.h"
#include "core/notify_queue.h"
#include "core/request.h"
#include "core/segment_cache.h"
#include "engine/route.h"


namespace mcrs {

class HandshakeServer;
class TcpServer;
class TcpClient;
class IpcTransport;
class SameHostServer;
class SameHostClient;
class MetadataDirectory;
namespace rdma {
class RdmaTransport;
struct RdmaTransportOptions;
}

class TransferEngine {
public:
    // Binds the handshake listener and installs the configured transports.
    // Throws Error on failure.
    explicit TransferEngine(EngineConfig cfg);
    ~TransferEngine();
    TransferEngine(const TransferEngine &) = delete;
    TransferEngine &operator=(const TransferEngine &) = delete;

    const EngineConfig &config() const { return cfg_; }
    const std::string &segment_name() const { return segment_name_; }
    const std::string &local_host() const { return local_host_; }
    uint16_t rpc_port() const { return rpc_port_; }
    uint16_t tcp_data_port() const { return tcp_port_; }

    // Installs "tcp" or "rdma" (others: kErrNotImplemented). Idempotent.
    // "rdma" throws Error when no usable NIC / verbs library is found.
    // `topology_json` (rdma only): a priority matrix replacing discovery and
    // MC_CUSTOM_TOPO_JSON; installing again with a different one throws.
    void install_transport(const std::string &proto, const std::string &topology_json = "");
    // Removes an installed transport (admin.cpp). "rdma": new transfers no
    // longer use it; RDMA work still in flight fails, and its memory
    // registrations and queue pairs go once the last call using it returns.
    // "tcp": new transfers no longer use it and the data listener stops;
    // requests already handed to the TCP client finish. TCP cannot be
    // installed again afterwards. Throws Error naming the cause when `proto`
    // is unknown or not installed.
    void uninstall_transport(const std::string &proto);
    // Installs RDMA when it comes up (or MC_FORCE_HCA demands it), else TCP,
    // as upstream's auto-discovery does; MC_FORCE_TCP skips RDMA.
    void install_auto_transport();
    bool has_tcp() const { return tcp_installed_.load(); }
    bool has_rdma() const { return rdma() != nullptr; }
    // The RDMA transport, or null when not installed. The reference keeps
    // it alive across a concurrent uninstall.
    std::shared_ptr<rdma::RdmaTransport> rdma() const { return std::atomic_load(&rdma_); }
    // The RDMA transport's topology and per-NIC counters as JSON; throw
    // kErrInvalidArgument when it is not installed.
    Json rdma_topology() const;
    Json rdma_counters() const;
    // RDMA NIC discovery (admin.cpp). With RDMA installed: every NIC's port
    // is read again. Without: NICs are probed as an RDMA install would and
    // released again; finding none is a result (the reason is kept), not an
    // error. The outcome is what show_links reports. Returns the NIC count.
    size_t discover_topology();
    // Local NICs, topology and installed transports, as text or JSON.
    std::string show_links(bool json) const;

    // Memory.
    void register_memory(void *addr, size_t len, const std::string &location, bool remote);
    void register_memory_batch(const std::vector<RegionInfo> &regions);
    void unregister_memory(void *addr);
    bool wait_region_idle(void *addr, int64_t timeout_ms) const {
        return registry_.wait_idle(reinterpret_cast<uint64_t>(addr), timeout_ms);
    }
    // Location ("cuda:1", "cpu:0", ...) of the registered buffer holding
    // `addr`; empty when none does.
    std::string location_of(const void *addr) const {
        RegionPin p = registry_.pin(reinterpret_cast<uint64_t>(addr), 1, /*need_remote=*/false);
        return p ? p.region()->location : std::string();
    }

    // Segments.
    int32_t open_segment(const std::string &name, bool no_cache);
    void close_segment(int32_t id);
    void remove_cached_segment(const std::string &name);
    std::pair<int, std::string> sync_segment_cache();
    std::shared_ptr<const SegmentDesc> segment_desc(int32_t id) const;
    // Sends a probe to the owner of `id`. Throws Error.
    void probe_segment(int32_t id);

    // Batches. Submit/status/free throw StatusError with upstream's codes.
    uint64_t allocate_batch(size_t capacity);
    // Throws kStatusTooManyRequests when `n` more requests do not fit in
    // the batch (what submit would say), before a caller translates them.
    void check_room(uint64_t batch_id, size_t n) const;
    void submit(uint64_t batch_id, const Request *reqs, size_t n,
                const PendingNotify *notify);
    // Submits a block list (core/request.h) as one task of the batch, whose
    // status covers every piece; returns the task's index. Everything is
    // checked first (StatusError naming the cause; the batch is untouched
    // then): bounds, the destination ids distinct, each region's span of
    // blocks on each side without wrap-around, and the local span inside one
    // registered buffer. Peer addresses are checked where requests' are.
    size_t submit_blocks(uint64_t batch_id, const BlockList &list);
    int task_status(uint64_t batch_id, size_t task, uint64_t *bytes);
    std::string task_error(uint64_t batch_id, size_t task);
    // Waits for every submitted task; returns true when all are terminal.
    bool wait_batch(uint64_t batch_id, int64_t timeout_ms);
    // Copies up to `cap` statuses, marks terminal ones observed; returns the
    // task count.
    // Statuses of tasks [start, start + cap) (clipped to those submitted);
    // returns the number of tasks submitted. Linear in `cap`, so callers
    // walk a large batch in chunks without allocating.
    size_t batch_statuses(uint64_t batch_id, size_t start, int *status, uint64_t *bytes, size_t cap);
    void free_batch(uint64_t batch_id);
    // Empties a batch whose tasks were all seen terminal (StatusError
    // kStatusBatchBusy otherwise).
    void reset_batch(uint64_t batch_id);

    // Async readiness (core/completion_queue.h): the eventfd, created and
    // turned on by the first call, and the ids of batches that finished.
    int event_fd();
    size_t take_completions(uint64_t *ids, size_t cap, bool &overflowed) {
        return batches_.completions().take(ids, cap, overflowed);
    }

    // Notifications.
    std::vector<Notification> drain_notifications();
    void send_notify(int32_t segment_id, const std::string &name, const std::string &msg);

    void enable_graceful_shutdown() { graceful_.store(true); }

    // Engine-allocated ("managed") buffers (managed.cpp): page-aligned,
    // zeroed, registered with `location`; freed by free_managed or at
    // destruction. free_managed checks that `addr` is one and `len` its size.
    void *alloc_managed(size_t len, const std::string &location);
    void free_managed(void *addr, size_t len);
    // One request to segment `target` (opened, cached, by name), waited for
    // until it is terminal; throws Error(kErrTransferFailed) with the
    // reason when it fails. The transports' timeouts bound the wait.
    void transfer_sync(const std::string &target, int opcode, void *local, uint64_t remote, uint64_t len);

    struct Counters {
        uint64_t tcp_sent, tcp_served, tcp_rejected, ipc_copies, local_copies;
        uint64_t same_host_sent, same_host_served;
        uint64_t tcp_conns_refused, tcp_conns_idle_closed, hs_conns_refused;
        uint64_t notifies_refused, notify_bytes_queued;
        // Tasks accepted by submit, and task statuses handed to callers:
        // the second grows by one per task a caller reads, so a caller that
        // re-reads a batch's prefix per task shows up as reads >> tasks.
        uint64_t tasks_submitted, task_status_reads;
    };
    Counters counters() const;

    // Our own descriptor, as served to peers.
    SegmentDesc local_descriptor() const;

private:
    bool handle_handshake(uint8_t type, const Json &req, Json &reply);
    // Fills the GPU facts (device, location, IPC handle) of a region.
    void describe_region(RegionInfo &r) const;
    SegmentDesc fetch_descriptor(const std::string &name);

    // Centralised metadata (directory.cpp; all no-ops in P2PHANDSHAKE mode).
    // Opens the store the connection string names and picks the advertised
    // host and the segment name.
    void open_directory();
    // Puts this engine's rpc_meta (once, at start) and descriptor (on every
    // change); throw Error(kErrMetadata).
    void publish_rpc_meta();
    void publish_descriptor();
    // Deletes both keys (destruction; failures logged).
    void withdraw_from_directory();
    // After a registration of remote-accessible memory: publishes, or undoes
    // the registration and throws.
    void publish_or_undo(const std::vector<RegionInfo> &added);
    // After other changes: publishes, or logs why it could not.
    void republish(const char *after);
    // A peer's descriptor from the store.
    SegmentDesc fetch_from_directory(const std::string &name);
    // Where segment `name`'s handshake port is: parsed from the name in
    // P2PHANDSHAKE mode, its rpc_meta key otherwise (cached until the
    // descriptor is fetched again).
    HostPort handshake_address(const std::string &name);
    void start_refresher();
    void stop_refresher();
    // Stops every thread and transport (destructor; a constructor that
    // failed half way).
    void stop_all();
    std::shared_ptr<Batch> batch_or_throw(uint64_t id) const;
    std::shared_ptr<rdma::RdmaTransport> rdma_or_throw() const;
    void release_managed();  // destructor: unregisters and unmaps what is left
    void maybe_send_batch_notify(Batch &b);
    void run_local(std::vector<struct TransferItem> &items);
    void send_tcp(const SegmentDesc &d, std::vector<struct TransferItem> &items);
    // A target of one submit: its descriptor and what it offers us.
    struct Target {
        int32_t id;
        std::shared_ptr<const SegmentDesc> desc;
        PeerRoutes routes;
        std::shared_ptr<rdma::RdmaTransport> rdma;  // set when routes.rdma
    };
    // The opened segment `id` and its routes; throws StatusError (prefixed
    // `where`) when it is unknown or unreachable.
    Target make_target(int32_t id, const std::string &where) const;
    // What `d` offers this engine; throws StatusError (prefixed `where`)
    // when no installed transport reaches it.
    // `rdma_now`: the RDMA transport as this submit sees it (may be null).
    PeerRoutes peer_routes(const SegmentDesc &d, const std::string &where, bool rdma_now) const;
    rdma::RdmaTransportOptions rdma_options(const std::string &topology_json);
    // The route of one request to a peer; for Route::CudaIpc, memo.buffer
    // is the published buffer it targets. One memo per run of requests to
    // one peer.
    Route route_of(const PeerRoutes &p, const SegmentDesc &d, const struct TransferItem &it,
                   IpcRouteMemo &memo) const;
    // Checks request `i` (throws StatusError naming it), learns its target's
    // routes on first sight, pins its local range and fills `it`.
    // `prev`: the previous request's pin, shared when its region holds this
    // request's range too.
    void prepare_item(const Request &r, size_t i, std::vector<Target> &targets, struct TransferItem &it,
                      const RegionPin *prev);
    void dispatch(int32_t target, std::vector<struct TransferItem> &items, const std::vector<Target> &descs);
    // The CUDA IPC fast path of submit_blocks (block_lists.cpp): true when
    // the task was finished there, false (nothing done) when the pieces must
    // go the per-request way.
    bool try_ipc_blocks(const BlockList &l, const Target &t, const std::vector<RegionPin> &pins,
                        const std::vector<uint64_t> &remote_lo, const std::vector<uint64_t> &remote_size,
                        uint64_t remote_id_lo, Batch &batch, size_t task, uint64_t bytes);
    void dispatch_by_target(const Request *reqs, std::vector<struct TransferItem> &items,
                            std::vector<struct TransferItem> &group, const std::vector<Target> &targets);

    EngineConfig cfg_;
    std::string local_host_;
    std::string segment_name_;
    uint16_t rpc_port_ = 0;
    uint16_t tcp_port_ = 0;

    MemoryRegistry registry_;
    NotifyQueue notifies_;
    RateLimitedLog notify_log_;
    SegmentCache segments_;
    BatchTable batches_;

    mutable std::mutex install_mu_;
    std::atomic<bool> tcp_installed_{false};
    bool tcp_retired_ = false;  // uninstalled: never installed again (install_mu_)
    std::shared_ptr<rdma::RdmaTransport> rdma_;  // std::atomic_load / atomic_store only
    // What discover_topology found without RDMA installed (install_mu_).
    Json discovered_;
    std::string discovery_note_;
    mutable std::mutex managed_mu_;
    std::map<uint64_t, size_t> managed_;  // engine-allocated buffers: addr -> length
    std::atomic<bool> graceful_{false};
    std::unique_ptr<TcpServer> tcp_server_;
    std::unique_ptr<TcpClient> tcp_client_;
    std::unique_ptr<IpcTransport> ipc_;
    std::unique_ptr<SameHostServer> same_host_server_;
    std::unique_ptr<SameHostClient> same_host_client_;
    std::unique_ptr<HandshakeServer> handshake_;
    std::string host_id_;  // this boot of this host (for same-host paths)
    std::unique_ptr<MetadataDirectory> directory_;  // null in P2PHANDSHAKE mode
    std::mutex publish_mu_;                          // one descriptor PUT at a time, newest last
    std::mutex rpc_mu_;
    std::unordered_map<std::string, HostPort> rpc_addrs_;  // peers' rpc_meta (rpc_mu_)
    std::thread refresher_;  // MC_TE_METADATA_REFRESH_INTERVAL_SECONDS
    std::mutex refresh_mu_;
    std::condition_variable refresh_cv_;
    bool refresh_stop_ = false;
    std::atomic<uint64_t> local_copies_{0};
    std::atomic<uint64_t> tasks_submitted_{0};
    std::atomic<uint64_t> task_status_reads_{0};
};

}  // namespace mcrs
