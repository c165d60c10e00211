// The RDMA transport: NIC discovery and contexts (one PD + CQ per NIC),
// memory registration on every NIC, the descriptor's RDMA part, endpoints
// (RC QPs set up through the type-0 handshake with the ready-ACK step) and
// the data path (slices striped over the local NICs, READ/WRITE work
// requests, one poller thread, retries on another NIC).
//
// Never trusts a peer: every remote range is checked against the peer
// descriptor's buffers (and their rkeys) before anything is posted, and
// local ranges must lie in a region we registered ourselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "core/config.h"
#include "core/segment_descriptor.h"
#include "transport/rdma/handshake_desc.h"
#include "transport/rdma/link_layer.h"
#include "transport/rdma/rail_monitor.h"
#include "transport/rdma/topology.h"
#include "transport/rdma/verbs_loader.h"
#include "transport/transport.h"

namespace mcrs::rdma {

// A port's addressing, which GID_CHANGE / PORT_ACTIVE may change.
struct PortAddress {
    uint32_t lid = 0;
    int gid_index = -1;
    ibv::gid gid{};
    std::string gid_text;
    int active_mtu = 0;
};

// One opened NIC.
struct RdmaContext {
    std::string name;
    ibv::context *ctx = nullptr;
    ibv::pd *pd = nullptr;
    ibv::cq *cq = nullptr;
    LinkLayer link_layer = LinkLayer::Unknown;
    uint32_t lid = 0;
    int gid_index = -1;
    ibv::gid gid{};
    std::string gid_text;
    int numa_node = -1;
    int active_mtu = 0;
    std::atomic<bool> usable{true};
    std::atomic<int> disabled_event{0};  // the async event that disabled it
    std::atomic<int> outstanding{0};     // WRs posted, completion not yet polled (<= CQ size)
    // Load: bytes of the WRs counted in `outstanding`, and an EWMA of the
    // rate (bytes per second, post to completion) of successful WRs. The
    // EWMA is written by the poller thread only.
    std::atomic<uint64_t> inflight_bytes{0};
    std::atomic<double> ewma_bps{0.0};
    // Counters.
    std::atomic<uint64_t> wrs{0}, bytes{0}, errors{0}, retries{0};
    // lid, gid_index, gid, gid_text and active_mtu: written by discovery
    // (before any thread runs) and by refresh_port under addr_mu; read
    // through address() once the threads run.
    mutable std::mutex addr_mu;
    PortAddress address() const {
        std::lock_guard<std::mutex> g(addr_mu);
        return PortAddress{lid, gid_index, gid, gid_text, active_mtu};
    }
};

struct RdmaNicCounters {
    std::string name;
    std::string link_layer;
    int numa_node = -1;
    bool usable = false;
    uint64_t wrs = 0, bytes = 0, errors = 0, retries = 0;
    uint64_t inflight_bytes = 0;  // posted, completion not yet polled
    double ewma_bps = 0.0;        // bytes per second; 0 before the first completion
};

struct RdmaTransportOptions {
    std::string server_name;  // our segment name ("host:port"), the NIC-path server part
    std::vector<std::string> allow, deny;
    GpuRegistrationMode gpu_mode = GpuRegistrationMode::FromEnv;
    std::string verbs_library;  // "" = MC_VERBS_LIBRARY / libibverbs.so.1
    // Sends a type-0 handshake to a peer segment (name "host:port") and
    // waits at most timeout_ms for the reply (0: the caller's default).
    // Throws Error.
    std::function<Json(const std::string &segment, const Json &body, uint32_t timeout_ms)>
        send_handshake;
    // Fetches a peer's segment descriptor (the passive side needs it when a
    // request carries no local_gid). Throws Error. Unset: such requests fail.
    std::function<SegmentDesc(const std::string &segment)> fetch_descriptor;
    // A posted slice without a completion after this long is retried on
    // another rail (and fails after MC_RETRY_CNT). 0: MC_SLICE_TIMEOUT when
    // set, else transfer_timeout_ms.
    uint32_t slice_timeout_ms = 0;
    uint32_t transfer_timeout_ms = 30000;
    // Both the active side's wait for the ACK reply and the passive side's
    // wait for the ACK itself (docs/wire-protocol.md, RDMA endpoint handshake).
    uint32_t ready_ack_timeout_ms = 10000;
    // installTransport's args[0]: a priority matrix (JSON text) that
    // replaces discovery and MC_CUSTOM_TOPO_JSON. "" = none.
    std::string topology_json;
    // Test seam (C++ only): the GPUs whose "cuda:<ordinal>" entries
    // discovery adds. Unset: list_cuda_gpus() (the CUDA driver's GPUs
    // against /sys; none without libcuda.so.1 or in a CPU build). Tests
    // return gpus_from_bus_ids(ids, roots) over softverbs' fake sysfs.
    std::function<std::vector<GpuInfo>()> gpu_source;
};

class RdmaTransport {
public:
    // Loads verbs, discovers and opens NICs. Throws Error (kErrContext /
    // kErrDeviceNotFound) with a message saying what was found and what to do.
    explicit RdmaTransport(RdmaTransportOptions opt, RdmaConfig cfg = RdmaConfig::from_env());
    ~RdmaTransport();
    RdmaTransport(const RdmaTransport &) = delete;
    RdmaTransport &operator=(const RdmaTransport &) = delete;

    // Registers [addr, addr+len) on every NIC (hca_names order). `device`
    // >= 0: GPU memory. `location` ("cpu:0", "cuda:1", "" / "*" unknown)
    // picks the NICs its transfers stripe over. Throws Error with
    // registration_failure_message.
    void register_region(uint64_t addr, uint64_t len, int device, bool remote,
                         const std::string &location = "");
    // Deregisters (call after the registry has removed the region).
    void deregister_region(uint64_t addr);

    // Fills protocol, devices[], priority_matrix, lkey/rkey of buffers.
    void fill_descriptor(SegmentDesc &d) const;

    // Passive side of a type-0 handshake.
    Json handle_connection(const Json &request);

    // Posts `items` to `peer` (its descriptor). Items end complete/failed.
    // The descriptor object is the cache key of the peer's NIC plans: pass
    // the same pointer while the descriptor is unchanged.
    void submit(const std::shared_ptr<const SegmentDesc> &peer, std::vector<TransferItem> &items);

    std::vector<RdmaNicCounters> counters() const;
    // Re-reads every NIC's port (GID, LID, MTU), as a GID_CHANGE event
    // would; endpoints of a NIC whose address moved are dropped. Returns
    // how many NICs changed address.
    size_t rediscover();
    // {"devices":[{name, link_layer, numa_node, usable, gid, lid}], "priority_matrix":{...}}
    Json topology_json() const;
    const Topology &topology() const { return topo_; }
    const ibv::VerbsLibrary &verbs() const { return *lib_; }
    size_t nic_count() const { return ctxs_.size(); }
    // Whether the rail (our NIC `local_nic`, peer NIC path) is paused.
    bool rail_paused(const std::string &local_nic, const std::string &peer_nic_path) const;

    struct Endpoint;
    struct Slice;
    struct PeerRoute;

private:
    // Definitions by concern: construction, teardown and counters in
    // rdma_transport.cpp; discovery and publication in rdma_discovery.cpp;
    // registration in rdma_memory.cpp; endpoints and async events in
    // rdma_endpoints.cpp; completions and rail bookkeeping in
    // rdma_completion.cpp; slicing and posting in rdma_datapath.cpp.

    // ---- discovery (rdma_discovery.cpp) ----
    void discover();
    // Opens NIC `name` (port, GID, PD, CQ) and fills `info`; nullptr, with
    // `problem` saying why, when it cannot be used.
    std::unique_ptr<RdmaContext> open_nic(ibv::device *dev, const std::string &name, NicInfo &info,
                                          std::string &problem);
    // topo_ from discovery over the opened NICs, or from the override.
    void build_topology(const std::vector<std::unique_ptr<RdmaContext>> &opened,
                        const std::vector<NicInfo> &infos);
    // Moves the opened NICs the matrix names into ctxs_ in its order and
    // closes the others.
    void adopt_in_matrix_order(std::vector<std::unique_ptr<RdmaContext>> &opened);
    // Re-queries the port of NIC `nic` (lid, active_mtu) and re-selects its
    // GID (MC_GID_INDEX honoured; docs/wire-protocol.md, RDMA GID selection).
    // Returns whether the address changed; false (logged) when the port
    // cannot be queried or has no usable GID.
    bool refresh_port(size_t nic);
    void poller_loop();
    void events_loop();
    std::shared_ptr<Endpoint> get_endpoint(size_t nic, const PeerRoute &route, size_t peer_idx);
    // The cached plans for `peer` (rebuilt when the descriptor object or
    // the set of usable local NICs changed).
    std::shared_ptr<PeerRoute> route_for(const std::shared_ptr<const SegmentDesc> &peer);
    std::shared_ptr<Endpoint> create_qps(size_t nic);
    void connect_qps(Endpoint &ep, const std::vector<uint32_t> &peer_qpn, const ibv::gid &peer_gid,
                     uint32_t peer_lid);
    // Active side of the handshake for the fresh endpoint `ep` (its QPs
    // end in RTS); throws Error. The caller destroys the QPs on failure.
    void handshake_active(Endpoint &ep, const SegmentDesc &peer, const DeviceDesc &peer_dev,
                          const std::string &own_path);
    // The passive side's reply naming our QPs of `ep`.
    Json passive_reply(const Endpoint &ep, const std::string &requester_path) const;
    // Passive side: a new endpoint on `local_device` for `req`, stored
    // under `key`; returns the reply (a rejection on failure).
    Json accept_passive(const HandShakeDesc &req, const std::string &local_device, const std::string &key,
                        bool wait_for_ack);
    void drop_endpoint(const std::shared_ptr<Endpoint> &ep);
    // Posts (or re-posts) a slice. from_poller: called by the poller thread,
    // which must not wait for free send-queue slots (it is the one freeing
    // them): a slice that finds the queues full is parked in pending_.
    void post_slice(Slice *s, bool from_poller);
    enum class PostOutcome { Posted, QueueFull, Failed };
    // One post of `s` on a free QP of `ep`; Failed sets `err` (and drops
    // the endpoint). After Posted, `s` belongs to the poller.
    PostOutcome post_on_endpoint(Slice *s, const std::shared_ptr<Endpoint> &ep, uint32_t lkey,
                                 std::string &err);
    // Back-pressure on NIC `nic`: true when the caller should try again;
    // false when `s` was failed (deadline) or parked for the poller.
    bool wait_for_slot(Slice *s, size_t nic, bool from_poller);
    // Why `item` cannot be sliced ("" if it can); fills the location of its
    // local registration and the peer buffer index of its remote range.
    std::string check_item(const TransferItem &item, const SegmentDesc &peer, std::string &location,
                           size_t &peer_buf) const;
    // The lkey on NIC `nic` of the registration holding [addr, addr+len);
    // false when that memory is no longer registered.
    bool find_lkey(uint64_t addr, uint64_t len, size_t nic, uint32_t &lkey) const;
    void finish_slice(Slice *s, bool ok, const std::string &why);
    // Retries `s` after a failure on its rail (or fails it after
    // MC_RETRY_CNT): `blame` records the error on the rail, `avoid_local`
    // moves it off its local NIC.
    void retry_slice(Slice *s, const std::string &why, bool blame, bool avoid_local, bool from_poller);
    // Slices posted longer than the slice timeout: retried on a copy (the
    // original stays until its completion, if any, arrives).
    void expire_slices();
    // Passive endpoints whose ready-ACK did not arrive in time: torn down.
    void expire_ack_waits();
    std::string rail_key(size_t nic, const std::string &peer_path) const;
    std::string peer_path_of(const Slice &s) const;
    // Whether the rail (local NIC, peer devices[] index) of `route` is
    // paused; allocates nothing while no rail is paused.
    bool rail_paused(size_t nic, const PeerRoute &route, size_t peer_idx) const;
    // Fills gid/lid of `nic_path` from its segment's published devices[];
    // returns "" or why it could not.
    std::string lookup_requester_gid(const std::string &nic_path, std::string &gid, uint32_t &lid);
    uint32_t slice_timeout_ms() const;
    const ibv::VerbsLibrary *lib_ = nullptr;

    RdmaTransportOptions opt_;
    RdmaConfig cfg_;
    Topology topo_;
    std::vector<std::unique_ptr<RdmaContext>> ctxs_;  // in hca_names() order

    struct Reg {
        uint64_t len = 0;
        bool remote = false;
        std::string location;        // "*" when unknown
        std::vector<ibv::mr *> mrs;  // per NIC
        int dmabuf_fd = -1;
    };
    mutable std::mutex reg_mu_;
    std::map<uint64_t, Reg> regs_;

    std::mutex ep_mu_;
    // Active endpoints keyed by nic index + peer NIC path; passive by own
    // device + requester NIC path.
    std::map<std::string, std::shared_ptr<Endpoint>> active_, passive_;

    std::vector<std::shared_ptr<Endpoint>> graveyard_;  // torn down, QPs destroyed at teardown
    std::mutex connect_mu_;   // serializes active handshakes
    std::mutex passive_mu_;   // serializes passive handshakes
    std::atomic<size_t> next_rr_{0};
    // Bumped after any NIC's usable flag changes: cached routes go stale.
    std::atomic<uint64_t> usable_epoch_{0};
    std::mutex routes_mu_;
    std::map<std::string, std::shared_ptr<PeerRoute>> routes_;  // by peer segment name
    std::mutex pending_mu_;
    std::vector<Slice *> pending_;  // parked by the poller (queues full)
    RailMonitor rails_;
    std::mutex posted_mu_;
    std::set<Slice *> posted_;   // posted, completion not yet polled
    std::set<Slice *> zombies_;  // timed out while posted: freed at completion or teardown
    std::atomic<bool> closing_{false};  // teardown: nothing new is posted
    std::atomic<bool> stop_{false};
    std::atomic<int64_t> inflight_{0};
    std::thread poller_, events_;
};

}  // namespace mcrs::rdma
