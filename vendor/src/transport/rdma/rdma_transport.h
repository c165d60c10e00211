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
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "engine/config.h"
#include "engine/segment_descriptor.h"
#include "transport/rdma/link_layer.h"
#include "transport/rdma/rdma_env.h"
#include "transport/rdma/topology.h"
#include "transport/rdma/verbs_loader.h"
#include "transport/transport.h"

namespace mcrs::rdma {

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
    // Counters.
    std::atomic<uint64_t> wrs{0}, bytes{0}, errors{0}, retries{0};
};

struct RdmaNicCounters {
    std::string name;
    std::string link_layer;
    int numa_node = -1;
    bool usable = false;
    uint64_t wrs = 0, bytes = 0, errors = 0, retries = 0;
};

struct RdmaTransportOptions {
    std::string server_name;  // our segment name ("host:port"), the NIC-path server part
    std::vector<std::string> allow, deny;
    GpuRegistrationMode gpu_mode = GpuRegistrationMode::FromEnv;
    std::string verbs_library;  // "" = MC_VERBS_LIBRARY / libibverbs.so.1
    // Sends a type-0 handshake to a peer segment (name "host:port"). Throws Error.
    std::function<Json(const std::string &segment, const Json &body)> send_handshake;
    uint32_t transfer_timeout_ms = 30000;
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
    // >= 0: GPU memory. Throws Error with registration_failure_message.
    void register_region(uint64_t addr, uint64_t len, int device, bool remote);
    // Deregisters (call after the registry has removed the region).
    void deregister_region(uint64_t addr);

    // Fills protocol, devices[], priority_matrix, lkey/rkey of buffers.
    void fill_descriptor(SegmentDesc &d) const;

    // Passive side of a type-0 handshake.
    Json handle_connection(const Json &request);

    // Posts `items` to `peer` (its descriptor). Items end complete/failed.
    void submit(const SegmentDesc &peer, std::vector<TransferItem> &items);

    std::vector<RdmaNicCounters> counters() const;
    // {"devices":[{name, link_layer, numa_node, usable, gid, lid}], "priority_matrix":{...}}
    Json topology_json() const;
    const Topology &topology() const { return topo_; }
    const ibv::VerbsLibrary &verbs() const { return *lib_; }
    size_t nic_count() const { return ctxs_.size(); }

    struct Endpoint;
    struct Slice;

private:
    void discover();
    void poller_loop();
    void events_loop();
    std::shared_ptr<Endpoint> get_endpoint(size_t nic, const SegmentDesc &peer,
                                           const std::string &peer_dev, const DeviceDesc *pdev);
    std::shared_ptr<Endpoint> create_qps(size_t nic);
    void connect_qps(Endpoint &ep, const std::vector<uint32_t> &peer_qpn, const ibv::gid &peer_gid,
                     uint32_t peer_lid);
    void drop_endpoint(const std::shared_ptr<Endpoint> &ep);
    // Posts (or re-posts) a slice. from_poller: called by the poller thread,
    // which must not wait for free send-queue slots (it is the one freeing
    // them): a slice that finds the queues full is parked in pending_.
    void post_slice(Slice *s, bool from_poller);
    void finish_slice(Slice *s, bool ok, const std::string &why);
    const ibv::VerbsLibrary *lib_ = nullptr;

    RdmaTransportOptions opt_;
    RdmaConfig cfg_;
    Topology topo_;
    std::vector<std::unique_ptr<RdmaContext>> ctxs_;  // in hca_names() order

    struct Reg {
        uint64_t len = 0;
        bool remote = false;
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
    std::mutex pending_mu_;
    std::vector<Slice *> pending_;  // parked by the poller (queues full)
    std::atomic<bool> closing_{false};  // teardown: nothing new is posted
    std::atomic<bool> stop_{false};
    std::atomic<int64_t> inflight_{0};
    std::thread poller_, events_;
};

}  // namespace mcrs::rdma
