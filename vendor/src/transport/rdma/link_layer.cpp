#include "transport/rdma/link_layer.h"

#include <strings.h>

#include "common/text.h"
#include "transport/rdma/gid.h"

namespace mcrs::rdma {

const char *link_layer_name(LinkLayer ll) noexcept {
    switch (ll) {
        case LinkLayer::IB: return "IB";
        case LinkLayer::RoCE: return "RoCE";
        default: return "unknown";
    }
}

LinkLayer parse_link_layer(const std::string &text) {
    std::string t = trim(text);
    if (strcasecmp(t.c_str(), "InfiniBand") == 0 || strcasecmp(t.c_str(), "IB") == 0)
        return LinkLayer::IB;
    if (strcasecmp(t.c_str(), "Ethernet") == 0 || strcasecmp(t.c_str(), "RoCE") == 0)
        return LinkLayer::RoCE;
    return LinkLayer::Unknown;
}

LinkLayer infer_peer_link_layer(const std::string &explicit_key, uint32_t lid,
                                const std::string &gid) {
    LinkLayer declared = parse_link_layer(explicit_key);
    if (declared != LinkLayer::Unknown) return declared;
    if (lid != 0) return LinkLayer::IB;
    auto g = parse_gid(gid);
    if (!g || gid_is_zero(*g)) return LinkLayer::Unknown;
    if (gid_is_ipv4_mapped(*g)) return LinkLayer::RoCE;
    if (!gid_is_link_local(*g)) return LinkLayer::RoCE;
    if (gid_has_eui64_marker(*g)) return LinkLayer::RoCE;
    return LinkLayer::Unknown;
}

}  // namespace mcrs::rdma
