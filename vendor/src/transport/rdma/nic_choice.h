// Which local NICs a request stripes over and which peer NICs it targets
// (the priority matrix entry of the buffer's location, ours for the local
// buffer, the peer's for the target buffer; docs/wire-protocol.md, RDMA
// priority matrix) and which (local NIC, peer NIC) rail one slice takes, as
// pure functions over indexes.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "transport/rdma/topology.h"

namespace mcrs::rdma {

struct NicPlan {
    std::vector<size_t> stripe;    // slices are spread over these
    std::vector<size_t> fallback;  // used only when no stripe NIC can take a slice
};
using LocalNicPlan = NicPlan;

// The rule shared by both sides. `index_of` maps a matrix name to an index
// (-1 unknown). stripe = the eligible preferred NICs of `entry`; when none,
// the eligible available ones; when none, every eligible NIC. fallback =
// the other eligible NICs (available first, then the rest, `eligible` order).
NicPlan plan_nics(const TopologyEntry &entry, const std::function<int(const std::string &)> &index_of,
                  const std::vector<size_t> &eligible);

// `eligible`: HCA indexes that may carry the request at all (usable, link
// layer agreed with the peer, allow/deny already applied), in HCA order.
// stripe = the eligible "preferred" NICs of topo.entry_for(location); when
// none, the eligible "available" ones; when none, every eligible NIC.
// fallback = the other eligible NICs (available first, then the rest).
LocalNicPlan plan_local_nics(const Topology &topo, const std::string &location,
                             const std::vector<size_t> &eligible);

// The peer side: `eligible` are indexes into the peer's devices[] (link
// layer agreed), `location` the target buffer's published "name". Same
// rule over the peer's published entry for that location (PeerTopology:
// unknown location -> "*" -> every device preferred).
NicPlan plan_peer_nics(const PeerTopology &peer, const std::string &location,
                       const std::vector<size_t> &eligible);

struct RailPick {
    size_t local_pos = 0;  // index into the local combined order stripe + fallback
    size_t peer_pos = 0;   // index into the peer combined order stripe + fallback
    bool found = false;
};

// Walks locals (stripe rotated by `local_start`, then fallback) and, for
// each, peers (stripe rotated by `peer_start`, then fallback) for the first
// rail whose local NIC is usable, is not `avoid_local` and whose rail is
// not paused. The avoidance and then the pauses are dropped when nothing
// else is left (a paused rail beats none). found = false only when no local
// NIC is usable or a plan is empty. `paused` gets the peer NIC itself
// (local_at(peers, peer_pos)), not its position.
RailPick pick_rail(const NicPlan &locals, size_t local_start, const NicPlan &peers,
                   size_t peer_start, const std::function<bool(size_t local)> &usable,
                   const std::function<bool(size_t local, size_t peer_nic)> &paused,
                   long avoid_local = -1);

// The NIC at `pos` of the combined order stripe + fallback (either side).
size_t local_at(const NicPlan &plan, size_t pos);
inline size_t nic_at(const NicPlan &plan, size_t pos) { return local_at(plan, pos); }
inline size_t plan_size(const NicPlan &plan) { return plan.stripe.size() + plan.fallback.size(); }

}  // namespace mcrs::rdma
