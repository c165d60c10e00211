// Which local NICs a request stripes over (PROTOCOL.md 6.3/6.5: the
// priority matrix entry of the buffer's location) and which (local NIC,
// peer NIC) rail one slice takes, as pure functions over HCA indexes.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "transport/rdma/topology.h"

namespace mcrs::rdma {

struct LocalNicPlan {
    std::vector<size_t> stripe;    // slices are spread over these
    std::vector<size_t> fallback;  // used only when no stripe NIC can take a slice
};

// `eligible`: HCA indexes that may carry the request at all (usable, link
// layer agreed with the peer, allow/deny already applied), in HCA order.
// stripe = the eligible "preferred" NICs of topo.entry_for(location); when
// none, the eligible "available" ones; when none, every eligible NIC.
// fallback = the other eligible NICs (available first, then the rest).
LocalNicPlan plan_local_nics(const Topology &topo, const std::string &location,
                             const std::vector<size_t> &eligible);

struct RailPick {
    size_t local_pos = 0;  // index into the combined order stripe + fallback
    size_t peer_pos = 0;   // index into the peer list
    bool found = false;
};

// Walks locals (stripe rotated by `local_start`, then fallback) and peers
// (rotated by `peer_start`) for the first rail whose local NIC is usable,
// is not `avoid_local` and whose rail is not paused. The avoidance and then
// the pauses are dropped when nothing else is left (a paused rail beats
// none). found = false only when no local NIC is usable or a list is empty.
RailPick pick_rail(const LocalNicPlan &plan, size_t local_start, size_t peer_count,
                   size_t peer_start, const std::function<bool(size_t local)> &usable,
                   const std::function<bool(size_t local, size_t peer_pos)> &paused,
                   long avoid_local = -1);

// The NIC at `pos` of the combined order stripe + fallback.
size_t local_at(const LocalNicPlan &plan, size_t pos);

}  // namespace mcrs::rdma
