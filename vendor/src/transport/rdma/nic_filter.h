// Which local NICs the transport may use: the allow/deny lists (engine
// config and MC_TE_FILTERS), and link-layer agreement with a peer (an
// InfiniBand port can never talk to a RoCE port).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/segment_descriptor.h"
#include "transport/rdma/link_layer.h"

namespace mcrs::rdma {

struct NicFilterResult {
    std::vector<std::string> kept;     // discovery order
    std::vector<std::string> removed;  // discovered but filtered out
    // Names given in a list that match no discovered device (typos): reported
    // as a warning, never fatal on their own.
    std::vector<std::string> unknown_names;
    std::string warning;  // "" when nothing to say
};

// A NIC is kept when it is in `allow` (empty = every NIC), in `env_filters`
// (MC_TE_FILTERS; empty = every NIC) and not in `deny`. Both allow lists
// apply (intersection).
// Throws Error(kErrDeviceNotFound) when devices were discovered but the
// lists leave none, naming the lists and the discovered devices. No
// discovered device at all is not an error here (the engine then has no RDMA).
NicFilterResult filter_devices(const std::vector<std::string> &discovered,
                               const std::vector<std::string> &allow,
                               const std::vector<std::string> &deny,
                               const std::vector<std::string> &env_filters);

struct NicLink {
    std::string name;
    LinkLayer link_layer = LinkLayer::Unknown;
};

// devices[] of a peer's descriptor with infer_peer_link_layer applied.
std::vector<NicLink> peer_links_from_descriptor(const std::vector<DeviceDesc> &devices);

struct LinkPlan {
    LinkLayer link_layer = LinkLayer::Unknown;  // the one both sides settle on
    std::vector<size_t> local;                  // indexes into the local list
    std::vector<size_t> peer;                   // indexes into the peer list
    bool uses_unknown_peers = false;            // some peer NIC's layer was guessed
};

// Chooses one link layer for traffic with a peer, then the NICs of each side
// that may be paired (every local NIC of `local` with every peer NIC of
// `peer`; IB is never paired with RoCE).
//  * Known layers on both sides: the common ones; when both IB and RoCE are
//    common, IB. The rule is symmetric, so both engines pick the same layer
//    from each other's descriptors.
//  * A NIC of Unknown layer is compatible with every layer (see
//    link_layer.h: a peer that gives no hint). When no known layer is common
//    but unknowns make a pairing possible, the layer comes from the side that
//    knows (IB first).
//  * No pairing possible: Error(kErrDeviceNotFound) listing local and peer
//    NICs per layer and what to do.
LinkPlan plan_link_layer(const std::vector<NicLink> &local, const std::vector<NicLink> &peer,
                         const std::string &peer_name);

}  // namespace mcrs::rdma
