#include "transport/rdma/nic_choice.h"

#include <algorithm>

namespace mcrs::rdma {

namespace {

bool has(const std::vector<size_t> &v, size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<size_t> eligible_of(const Topology &topo, const std::vector<std::string> &names,
                                const std::vector<size_t> &eligible) {
    std::vector<size_t> out;
    for (const auto &n : names) {
        int i = topo.hca_index(n);
        if (i >= 0 && has(eligible, static_cast<size_t>(i)) && !has(out, static_cast<size_t>(i)))
            out.push_back(static_cast<size_t>(i));
    }
    return out;
}

}  // namespace

LocalNicPlan plan_local_nics(const Topology &topo, const std::string &location,
                             const std::vector<size_t> &eligible) {
    TopologyEntry e = topo.entry_for(location);
    std::vector<size_t> pref = eligible_of(topo, e.preferred, eligible);
    std::vector<size_t> avail = eligible_of(topo, e.available, eligible);
    LocalNicPlan p;
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

size_t local_at(const LocalNicPlan &plan, size_t pos) {
    size_t n = plan.stripe.size() + plan.fallback.size();
    pos %= n;
    return pos < plan.stripe.size() ? plan.stripe[pos] : plan.fallback[pos - plan.stripe.size()];
}

RailPick pick_rail(const LocalNicPlan &plan, size_t local_start, size_t peer_count,
                   size_t peer_start, const std::function<bool(size_t)> &usable,
                   const std::function<bool(size_t, size_t)> &paused, long avoid_local) {
    RailPick out;
    size_t ns = plan.stripe.size(), nf = plan.fallback.size();
    if (ns + nf == 0 || peer_count == 0) return out;
    // Combined-order positions: the stripe rotated, then the fallback.
    std::vector<size_t> order;
    for (size_t i = 0; i < ns; ++i) order.push_back((local_start + i) % ns);
    for (size_t i = 0; i < nf; ++i) order.push_back(ns + i);
    for (int strict = 2; strict >= 0; --strict) {
        for (size_t pos : order) {
            size_t nic = local_at(plan, pos);
            if (!usable(nic)) continue;
            if (strict >= 2 && avoid_local >= 0 && nic == static_cast<size_t>(avoid_local)) continue;
            for (size_t k = 0; k < peer_count; ++k) {
                size_t pp = (peer_start + k) % peer_count;
                if (strict >= 1 && paused && paused(nic, pp)) continue;
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
