#include "transport/rdma/gid.h"

#include <strings.h>

#include <algorithm>

#include "common/text.h"
#include "common/error.h"

namespace mcrs::rdma {

std::string format_gid(const Gid &gid) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(47);
    for (size_t i = 0; i < gid.size(); ++i) {
        if (i) out.push_back(':');
        out.push_back(kHex[gid[i] >> 4]);
        out.push_back(kHex[gid[i] & 0xF]);
    }
    return out;
}

namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

std::optional<Gid> parse_gid(std::string_view text) {
    Gid g{};
    size_t pos = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        if (i) {
            if (pos >= text.size() || text[pos] != ':') return std::nullopt;
            ++pos;
        }
        int value = 0, digits = 0;
        while (pos < text.size() && digits < 3) {
            int h = hex_value(text[pos]);
            if (h < 0) break;
            value = value * 16 + h;
            ++digits;
            ++pos;
        }
        if (digits == 0 || digits > 2) return std::nullopt;
        g[i] = static_cast<uint8_t>(value);
    }
    if (pos != text.size()) return std::nullopt;
    return g;
}

bool gid_is_zero(const Gid &g) noexcept {
    return std::all_of(g.begin(), g.end(), [](uint8_t b) { return b == 0; });
}

bool gid_is_ipv4_mapped(const Gid &g) noexcept {
    for (int i = 0; i < 10; ++i)
        if (g[i] != 0) return false;
    return g[10] == 0xff && g[11] == 0xff;
}

bool gid_is_link_local(const Gid &g) noexcept { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

bool gid_is_private_ipv4(const Gid &g) noexcept {
    if (!gid_is_ipv4_mapped(g)) return false;
    uint8_t a = g[12], b = g[13];
    if (a == 10) return true;                            // 10/8
    if (a == 172 && (b & 0xf0) == 16) return true;       // 172.16/12
    if (a == 100 && (b & 0xc0) == 64) return true;       // 100.64/10
    return false;
}

bool gid_has_eui64_marker(const Gid &g) noexcept { return g[11] == 0xff && g[12] == 0xfe; }

const char *gid_type_name(GidType t) noexcept {
    switch (t) {
        case GidType::IB: return "IB";
        case GidType::RoCEv1: return "RoCEv1";
        case GidType::RoCEv2: return "RoCEv2";
        default: return "unknown";
    }
}

GidType gid_type_from_sysfs(const std::string &text, bool port_is_ib) {
    std::string t = trim(text);
    if (strcasecmp(t.c_str(), "RoCE v2") == 0) return GidType::RoCEv2;
    if (strcasecmp(t.c_str(), "IB/RoCE v1") == 0)
        return port_is_ib ? GidType::IB : GidType::RoCEv1;
    return GidType::Unknown;
}

bool netdev_is_degraded(const std::string &netdev) {
    static const char *kPrefixes[] = {"flannel", "cni", "calico", "vxlan", "docker", "tunl0"};
    for (const char *p : kPrefixes)
        if (netdev.compare(0, std::char_traits<char>::length(p), p) == 0) return true;
    return false;
}

int gid_priority_class(const GidEntry &e) {
    if (!e.queryable || gid_is_zero(e.gid)) return 0;
    if (e.type != GidType::IB && e.type != GidType::RoCEv2) return 7;
    bool has_netdev = !e.netdev.empty();
    bool degraded = netdev_is_degraded(e.netdev) ||
                    (e.type == GidType::RoCEv2 && gid_is_link_local(e.gid));
    if (degraded) return has_netdev ? 4 : 6;
    if (gid_is_private_ipv4(e.gid)) return has_netdev ? 3 : 5;
    return has_netdev ? 1 : 2;
}

std::optional<GidSelection> select_gid_auto(const std::vector<GidEntry> &table) {
    const GidEntry *best = nullptr;
    int best_class = 0;
    for (const GidEntry &e : table) {
        int c = gid_priority_class(e);
        if (c == 0) continue;
        if (!best || c < best_class || (c == best_class && e.index < best->index)) {
            best = &e;
            best_class = c;
        }
    }
    if (!best) return std::nullopt;
    GidSelection s;
    s.index = best->index;
    s.priority_class = best_class;
    s.gid = best->gid;
    s.type = best->type;
    return s;
}

namespace {

std::string describe_table(const std::vector<GidEntry> &table) {
    std::string out;
    size_t shown = 0;
    for (const GidEntry &e : table) {
        if (shown == 16) {
            out += ", ...";
            break;
        }
        if (!out.empty()) out += ", ";
        out += std::to_string(e.index) + "=";
        if (!e.queryable) out += "(unreadable)";
        else if (gid_is_zero(e.gid)) out += "(zero)";
        else out += std::string(gid_type_name(e.type)) + (e.netdev.empty() ? "" : "/" + e.netdev);
        ++shown;
    }
    return out.empty() ? "empty" : out;
}

}  // namespace

GidSelection select_gid(const std::vector<GidEntry> &table, const GidIndexOverride &ov,
                        const std::string &device, int port) {
    std::string where = "device " + device + " port " + std::to_string(port);
    if (ov.index >= 0) {
        const GidEntry *hit = nullptr;
        for (const GidEntry &e : table)
            if (e.index == ov.index) hit = &e;
        std::string var = ov.variable.empty() ? "the forced GID index" : ov.variable;
        if (!hit)
            throw Error(kErrContext, var + "=" + std::to_string(ov.index) + " but " + where +
                                         " has no GID at that index (table: " +
                                         describe_table(table) + ")");
        if (!hit->queryable || gid_is_zero(hit->gid))
            throw Error(kErrContext, var + "=" + std::to_string(ov.index) + " but the GID of " +
                                         where + " at that index is " +
                                         (hit->queryable ? "zero" : "unreadable") +
                                         " (table: " + describe_table(table) +
                                         "); unset it for automatic selection");
        GidSelection s;
        s.index = hit->index;
        s.gid = hit->gid;
        s.type = hit->type;
        s.forced = true;
        return s;
    }
    auto s = select_gid_auto(table);
    if (!s)
        throw Error(kErrContext, where + " has no usable GID (table: " + describe_table(table) +
                                     "); check that the port is up and has an address");
    return *s;
}

}  // namespace mcrs::rdma
