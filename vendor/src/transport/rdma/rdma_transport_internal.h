// Private to the RdmaTransport definitions (rdma_*.cpp): the nested types
// the class declares (endpoints, peer routes, slices) and small helpers
// shared by more than one of its files. Nothing outside transport/rdma
// includes this.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/segment_descriptor.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/handshake_desc.h"
#include "transport/rdma/nic_choice.h"
#include "transport/rdma/rdma_transport.h"

namespace mcrs::rdma {

namespace detail {

inline ibv::gid to_ibv_gid(const Gid &g) {
    ibv::gid out{};
    static_assert(sizeof(out) == sizeof(g), "gid size");
    std::memcpy(&out, &g, sizeof out);
    return out;
}

// One transfer item's progress over its slices.
struct ItemState {
    TransferItem item;
    std::atomic<size_t> remaining{0};
    std::mutex mu;
    std::string why;
};

}  // namespace detail

struct RdmaTransport::Endpoint {
    size_t nic = 0;
    std::string key;
    std::string peer_path;
    std::vector<ibv::qp *> qps;
    std::vector<uint32_t> peer_qpn;
    EndpointState state = EndpointState::None;
    std::atomic<bool> broken{false};
    std::atomic<uint32_t> rr{0};
    std::mutex post_mu;
    std::unique_ptr<std::atomic<int>[]> qp_outstanding;  // per QP, <= MC_MAX_WR
    std::chrono::steady_clock::time_point ack_deadline;  // passive, WaitReadyAck
};

// Everything submit() derives from one peer descriptor and the usable local
// NICs, built once per (descriptor object, usable epoch) so that slices
// only index into it. Location plans are added lazily, under `mu`.
struct RdmaTransport::PeerRoute {
    std::weak_ptr<const SegmentDesc> desc;  // the version: a refetch is a new object
    uint64_t epoch = 0;                     // usable_epoch_ when built
    std::string error;                      // no common link layer etc.
    std::vector<size_t> lnics;              // local NICs of the agreed link layer
    std::vector<size_t> peer_nics;          // peer devices[] indexes, same
    PeerTopology topo;                      // the peer's published matrix
    std::vector<std::string> peer_paths;    // per devices[] index: "<server>@<dev>"
    std::vector<std::string> ep_keys;       // per nic * devices + index: active_ key
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const NicPlan>> local_plans, peer_plans;  // by location

    const std::string &ep_key(size_t nic, size_t peer_idx) const {
        return ep_keys[nic * peer_paths.size() + peer_idx];
    }
    std::shared_ptr<const NicPlan> local_plan(const Topology &t, const std::string &location) {
        std::lock_guard<std::mutex> g(mu);
        auto &p = local_plans[location];
        if (!p) p = std::make_shared<const NicPlan>(plan_local_nics(t, location, lnics));
        return p;
    }
    // The peer NICs of the target buffer's location (its "name";
    // docs/wire-protocol.md, RDMA priority matrix).
    std::shared_ptr<const NicPlan> peer_plan(const std::string &location) {
        std::lock_guard<std::mutex> g(mu);
        auto &p = peer_plans[location];
        if (!p) p = std::make_shared<const NicPlan>(plan_peer_nics(topo, location, peer_nics));
        return p;
    }
};

struct RdmaTransport::Slice {
    std::shared_ptr<detail::ItemState> item;
    std::shared_ptr<const SegmentDesc> peer;
    std::shared_ptr<PeerRoute> route;
    int opcode = 0;
    uint64_t local = 0, remote = 0, len = 0;
    size_t peer_buf = 0;
    std::shared_ptr<const NicPlan> plan;       // local NICs: stripe, then fallback
    std::shared_ptr<const NicPlan> peer_plan;  // peer devices[] indexes: stripe, then fallback
    size_t local_pos = 0, peer_pos = 0;        // into stripe + fallback of each
    long avoid_local = -1;               // a local fault happened on this NIC
    int retries = 0;
    std::shared_ptr<Endpoint> ep;
    size_t qp_index = 0;
    std::chrono::steady_clock::time_point deadline;   // back-pressure wait
    std::chrono::steady_clock::time_point posted_at;  // the slice timeout counts from here

    size_t nic() const { return local_at(*plan, local_pos); }
    size_t peer_idx() const { return nic_at(*peer_plan, peer_pos); }
};

}  // namespace mcrs::rdma
