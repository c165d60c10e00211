#include "transport/rdma/nic_filter.h"

#include <algorithm>

#include "common/text.h"
#include "common/error.h"
#include "common/log.h"

namespace mcrs::rdma {

namespace {

bool contains(const std::vector<std::string> &v, const std::string &s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

NicFilterResult filter_devices(const std::vector<std::string> &discovered,
                               const std::vector<std::string> &allow,
                               const std::vector<std::string> &deny,
                               const std::vector<std::string> &env_filters) {
    NicFilterResult r;
    for (const auto &n : discovered) {
        bool ok = (allow.empty() || contains(allow, n)) &&
                  (env_filters.empty() || contains(env_filters, n)) && !contains(deny, n);
        (ok ? r.kept : r.removed).push_back(n);
    }
    struct List {
        const char *label;
        const std::vector<std::string> *names;
    } lists[] = {{"device allow-list", &allow}, {"MC_TE_FILTERS", &env_filters}, {"device deny-list", &deny}};
    std::string unknown_text;
    for (const List &l : lists) {
        std::vector<std::string> unk;
        for (const auto &n : *l.names)
            if (!contains(discovered, n)) {
                unk.push_back(n);
                if (!contains(r.unknown_names, n)) r.unknown_names.push_back(n);
            }
        if (!unk.empty())
            unknown_text += std::string(unknown_text.empty() ? "" : "; ") + l.label + " names " +
                            join_list(unk);
    }
    if (!unknown_text.empty()) {
        r.warning = unknown_text + " which match no RDMA device (found: " +
                    (discovered.empty() ? "none" : join_list(discovered)) + ")";
        MC_LOG(Warn, r.warning);
    }
    if (r.kept.empty() && !discovered.empty())
        throw Error(kErrDeviceNotFound,
                    "no RDMA device left after filtering: found " + join_list(discovered) +
                        "; device allow-list=[" + join_list(allow) + "], MC_TE_FILTERS=[" +
                        join_list(env_filters) + "], deny-list=[" + join_list(deny) +
                        "]. Name at least one of the found devices in device_name / "
                        "MC_TE_FILTERS");
    return r;
}

std::vector<NicLink> peer_links_from_descriptor(const std::vector<DeviceDesc> &devices) {
    std::vector<NicLink> out;
    out.reserve(devices.size());
    for (const auto &d : devices)
        out.push_back({d.name, infer_peer_link_layer(d.link_layer, d.lid, d.gid)});
    return out;
}

namespace {

bool has(const std::vector<NicLink> &v, LinkLayer ll) {
    return std::any_of(v.begin(), v.end(), [&](const NicLink &n) { return n.link_layer == ll; });
}

std::string describe(const std::vector<NicLink> &v) {
    if (v.empty()) return "none";
    std::string out;
    for (LinkLayer ll : {LinkLayer::IB, LinkLayer::RoCE, LinkLayer::Unknown}) {
        std::vector<std::string> names;
        for (const auto &n : v)
            if (n.link_layer == ll) names.push_back(n.name);
        if (names.empty()) continue;
        out += std::string(out.empty() ? "" : "; ") + link_layer_name(ll) + " (" + join_list(names) + ")";
    }
    return out;
}

}  // namespace

LinkPlan plan_link_layer(const std::vector<NicLink> &local, const std::vector<NicLink> &peer,
                         const std::string &peer_name) {
    const LinkLayer order[] = {LinkLayer::IB, LinkLayer::RoCE};
    bool local_unknown = has(local, LinkLayer::Unknown);
    bool peer_unknown = has(peer, LinkLayer::Unknown);
    LinkLayer chosen = LinkLayer::Unknown;
    // 1. a layer both sides know they have.
    for (LinkLayer ll : order)
        if (has(local, ll) && has(peer, ll)) {
            chosen = ll;
            break;
        }
    // 2. a layer one side knows, matched by the other side's unknowns.
    if (chosen == LinkLayer::Unknown)
        for (LinkLayer ll : order)
            if ((has(local, ll) && peer_unknown) || (local_unknown && has(peer, ll))) {
                chosen = ll;
                break;
            }
    LinkPlan plan;
    if (chosen != LinkLayer::Unknown) {
        for (size_t i = 0; i < local.size(); ++i)
            if (local[i].link_layer == chosen || local[i].link_layer == LinkLayer::Unknown)
                plan.local.push_back(i);
        for (size_t i = 0; i < peer.size(); ++i)
            if (peer[i].link_layer == chosen || peer[i].link_layer == LinkLayer::Unknown) {
                plan.peer.push_back(i);
                if (peer[i].link_layer == LinkLayer::Unknown) plan.uses_unknown_peers = true;
            }
    } else if (local_unknown && peer_unknown) {
        // 3. nobody knows anything: allow everything rather than refuse.
        for (size_t i = 0; i < local.size(); ++i)
            if (local[i].link_layer == LinkLayer::Unknown) plan.local.push_back(i);
        for (size_t i = 0; i < peer.size(); ++i)
            if (peer[i].link_layer == LinkLayer::Unknown) plan.peer.push_back(i);
        plan.uses_unknown_peers = true;
    }
    plan.link_layer = chosen;
    if (plan.local.empty() || plan.peer.empty())
        throw Error(kErrDeviceNotFound,
                    "no RDMA link layer in common with peer " + peer_name + ": local NICs: " +
                        describe(local) + "; peer NICs: " + describe(peer) +
                        ". InfiniBand and RoCE ports cannot reach each other. Restrict both "
                        "engines to NICs of one link layer (device_name / device_allow_list or "
                        "MC_TE_FILTERS on each host, e.g. only the IB NICs or only the RoCE "
                        "NICs), or connect the hosts to a common fabric");
    return plan;
}

}  // namespace mcrs::rdma
