// Link layers of RDMA ports, and how we learn a peer's link layer from what
// its segment descriptor carries. InfiniBand and RoCE ports cannot exchange
// traffic, so the transport must never pair them.
#pragma once

#include <cstdint>
#include <string>

namespace mcrs::rdma {

enum class LinkLayer : int { Unknown = 0, IB = 1, RoCE = 2 };

// "IB", "RoCE" or "unknown" (the spelling we publish in "mc_link_layer").
const char *link_layer_name(LinkLayer ll) noexcept;

// Accepts sysfs' ports/<p>/link_layer text ("InfiniBand", "Ethernet") and our
// descriptor spelling ("IB", "RoCE"), case-insensitive and trimmed. Anything
// else is Unknown.
LinkLayer parse_link_layer(const std::string &text);

// The peer link-layer rule. Upstream's descriptor devices[] entry carries only
// {gid, lid, name}; ours adds "mc_link_layer". Decided in this order:
//  1. `explicit_key` (the value of "mc_link_layer", "" when absent) when it
//     parses: our own peers say what they are.
//  2. lid != 0 -> IB. Only InfiniBand ports get a LID from the subnet
//     manager; RoCE ports always report LID 0, and a port without a LID is not
//     ACTIVE and is never published.
//  3. lid == 0 and the GID parses and is non-zero:
//     - IPv4-mapped (::ffff:a.b.c.d) -> RoCE (a RoCE GID built from an IPv4
//       address of the netdev);
//     - not link-local (fe80::/10), i.e. a global/ULA IPv6 GID -> RoCE (an IB
//       port with a routable subnet prefix always has a LID, see 2);
//     - link-local with the EUI-64 marker ff:fe in bytes 11..12 -> RoCE (the
//       interface id was derived from an Ethernet MAC);
//     - link-local without that marker -> Unknown: it looks like an IB port
//       GUID but the LID is 0, so we cannot tell.
//  4. Anything else (bad or zero GID, lid 0) -> Unknown.
// Unknown peers are treated as compatible with either link layer (see
// nic_filter.h), so an unknown never causes a refusal on its own.
LinkLayer infer_peer_link_layer(const std::string &explicit_key, uint32_t lid,
                                const std::string &gid);

}  // namespace mcrs::rdma
