// GIDs: the text form (docs/wire-protocol.md, GID text form) and the
// automatic choice of a port's GID index (same document, RDMA GID
// selection). Pure logic over plain structs; the verbs layer fills a
// GidEntry table from ibv_query_gid_ex (or sysfs) and asks for an index.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"

namespace mcrs::rdma {

using Gid = std::array<uint8_t, 16>;

// 16 bytes as lower-case two-digit hex separated by ':' (47 characters).
std::string format_gid(const Gid &gid);
// Exactly 16 ':'-separated bytes, each 1 or 2 hex digits of either case; no
// whitespace, signs or trailing bytes. nullopt for anything else.
std::optional<Gid> parse_gid(std::string_view text);

bool gid_is_zero(const Gid &g) noexcept;
// ::ffff:a.b.c.d
bool gid_is_ipv4_mapped(const Gid &g) noexcept;
// fe80::/10
bool gid_is_link_local(const Gid &g) noexcept;
// IPv4-mapped and in 10/8, 172.16/12 or 100.64/10 (RDMA GID selection).
bool gid_is_private_ipv4(const Gid &g) noexcept;
// Bytes 11 and 12 are ff:fe: the interface id is an EUI-64 built from a MAC.
bool gid_has_eui64_marker(const Gid &g) noexcept;

enum class GidType : int { Unknown = 0, IB = 1, RoCEv1 = 2, RoCEv2 = 3 };
const char *gid_type_name(GidType t) noexcept;
// sysfs gid_attrs/types/<i>: "RoCE v2" -> RoCEv2; "IB/RoCE v1" -> IB on an
// InfiniBand port, RoCEv1 on an Ethernet port; anything else Unknown.
GidType gid_type_from_sysfs(const std::string &text, bool port_is_ib);

// The netdev names RDMA GID selection calls "degraded": flannel*, cni*,
// calico*, vxlan*, docker*, tunl0*.
bool netdev_is_degraded(const std::string &netdev);

struct GidEntry {
    int index = 0;
    Gid gid{};
    GidType type = GidType::Unknown;
    std::string netdev;  // gid_attrs/ndevs/<index>; empty when none
    bool queryable = true;
};

// Priority class (RDMA GID selection), 1 (best) .. 7 (fallback); 0 = never selectable
// (zero GID or not queryable). Classes 1..6 are for IB and RoCEv2 entries:
//   degraded (netdev_is_degraded, or a link-local RoCEv2 GID): 4 with a netdev, 6 without
//   else private IPv4-mapped:                                 3 with a netdev, 5 without
//   else routable:                                            1 with a netdev, 2 without
// "Degraded" is checked before "private": a docker0 GID at 172.17.x.x is a
// container bridge, not a fabric address. Every other type (RoCEv1, unknown)
// is class 7.
int gid_priority_class(const GidEntry &e);

struct GidSelection {
    int index = -1;
    int priority_class = 0;  // 0 when forced
    Gid gid{};
    GidType type = GidType::Unknown;
    bool forced = false;
};

// Best class, ties by lowest index; nullopt when nothing is selectable.
std::optional<GidSelection> select_gid_auto(const std::vector<GidEntry> &table);

// GidIndexOverride and its parser live with the rest of the configuration
// (core/config.h).

// Forced index when `ov.index >= 0` (must exist in `table`, be queryable and
// non-zero), otherwise select_gid_auto. Throws Error(kErrContext) naming the
// device, port and table contents when no GID can be used.
GidSelection select_gid(const std::vector<GidEntry> &table, const GidIndexOverride &ov,
                        const std::string &device, int port);

}  // namespace mcrs::rdma
