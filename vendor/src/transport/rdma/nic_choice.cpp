#include "transport/rdma/nic_choice.h"

#include <algorithm>

namespace mcrs::rdma {

namespace {

bool has(const std::vector<size_t> &v, size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<size_t> eligible_of(const std::function<int(const std::string &)> &index_of,
                                const std::vector<std::string> &names,
                                const std::vector<size_t> &eligible) {
    std::vector<size_t> out;
    for (const auto &n : names) {
        int i = index_of(n);
        if (i >= 0 && has(eligible, static_cast<size_t>(i)) && !has(out, static_cast<size_t>(i)))
            out.push_back(static_cast<size_t>(i));
    }
    return out;
}

}  // namespace

NicPlan plan_nics(const TopologyEntry &e, const std::function<int(const std::string &)> &index_of,
                  const std::vector<size_t> &eligible) {
    std::vector<size_t> pref = eligible_of(index_of, e.preferred, eligible);
    std::vector<size_t> avail = eligible_of(index_of, e.available, eligible);
    NicPlan p;
    if (!pref.empty()) {
        p.stripe = pref;
        p.fallback = avail;
    } else if (!avail.empty()) {
        p.stripe = avail;
    } else {
        p.stripe = eligible;
    }
    for (size_t i : eligible)
        if (!has(p.stripe, i) && !has(p.fallback, i)) p.fallback.push_back(i);
    return p;
}

LocalNicPlan plan_local_nics(const Topology &topo, const std::string &location,
                             const std::vector<size_t> &eligible) {
    return plan_nics(topo.entry_for(location), [&](const std::string &n) { return topo.hca_index(n); },
                     eligible);
}

NicPlan plan_peer_nics(const PeerTopology &peer, const std::string &location,
                       const std::vector<size_t> &eligible) {
    return plan_nics(peer.entry_for(location), [&](const std::string &n) { return peer.index_of(n); },
                     eligible);
}

size_t local_at(const NicPlan &plan, size_t pos) {
    size_t n = plan.stripe.size() + plan.fallback.size();
    pos %= n;
    return pos < plan.stripe.size() ? plan.stripe[pos] : plan.fallback[pos - plan.stripe.size()];
}

RailPick pick_rail(const NicPlan &locals, size_t local_start, const NicPlan &peers,
                   size_t peer_start, const std::function<bool(size_t)> &usable,
                   const std::function<bool(size_t, size_t)> &paused, long avoid_local) {
    RailPick out;
    size_t nl = plan_size(locals), np = plan_size(peers);
    if (nl == 0 || np == 0) return out;
    // Combined-order positions: the stripe rotated, then the fallback.
    auto walk = [](const NicPlan &p, size_t start, size_t k) {
        size_t ns = p.stripe.size();
        return k < ns ? (start + k) % ns : k;
    };
    for (int strict = 2; strict >= 0; --strict) {
        for (size_t i = 0; i < nl; ++i) {
            size_t pos = walk(locals, local_start, i);
            size_t nic = local_at(locals, pos);
            if (!usable(nic)) continue;
            if (strict >= 2 && avoid_local >= 0 && nic == static_cast<size_t>(avoid_local)) continue;
            for (size_t k = 0; k < np; ++k) {
                size_t pp = walk(peers, peer_start, k);
                if (strict >= 1 && paused && paused(nic, local_at(peers, pp))) continue;
                out.local_pos = pos;
                out.peer_pos = pp;
                out.found = true;
                return out;
            }
        }
    }
    return out;
}

}  // namespace mcrs::rdma
