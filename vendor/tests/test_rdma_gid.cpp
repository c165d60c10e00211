#include "common/error.h"
#include "test_util.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/link_layer.h"

using namespace mcrs::rdma;
using mcrs::Error;

namespace {

Gid gid_of(const char *text) {
    auto g = parse_gid(text);
    if (!g) mctest::record_failure(__FILE__, __LINE__, std::string("bad test GID ") + text);
    return g.value_or(Gid{});
}

const char *kV4Private = "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01";  // 10.0.0.1
const char *kV4Public = "00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:01:02";   // 192.168.1.2
const char *kLinkLocal = "fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02";
const char *kIbGid = "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3";
const char *kGlobalV6 = "20:01:0d:b8:00:00:00:00:00:00:00:00:00:00:00:01";

}  // namespace

TEST(rdma_gid_format_parse_roundtrip) {
    Gid g{};
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<uint8_t>(i * 17 + 3);
    std::string s = format_gid(g);
    CHECK_EQ(s.size(), size_t(47));
    CHECK_EQ(s, std::string("03:14:25:36:47:58:69:7a:8b:9c:ad:be:cf:e0:f1:02"));
    auto back = parse_gid(s);
    REQUIRE(back.has_value());
    CHECK(*back == g);
    CHECK_EQ(format_gid(Gid{}), std::string("00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00"));
}

TEST(rdma_gid_parse_accepts_any_case_and_short_bytes) {
    auto up = parse_gid("FE:80:00:00:00:00:00:00:98:03:9B:03:00:A1:B2:C3");
    REQUIRE(up.has_value());
    CHECK_EQ(format_gid(*up), std::string(kIbGid));
    auto shortb = parse_gid("fe:80:0:0:0:0:0:0:98:3:9b:3:0:a1:b2:c3");
    REQUIRE(shortb.has_value());
    CHECK_EQ(format_gid(*shortb), std::string(kIbGid));
}

TEST(rdma_gid_parse_rejects_garbage) {
    const char *bad[] = {
        "",
        "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2",        // 15 bytes
        "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3:00",  // 17 bytes
        "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3:",    // trailing colon
        ":fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3",    // leading colon
        "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3 ",    // trailing space
        " fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3",
        "fe:800:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3",    // 3 digits
        "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:cg",     // non-hex
        "fe:80::00:00:00:00:00:98:03:9b:03:00:a1:b2:c3:00",    // empty byte
        "fe80:0000:0000:0000:9803:9b03:00a1:b2c3",             // IPv6 notation
        "-1:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3",
        "fe-80-00-00-00-00-00-00-98-03-9b-03-00-a1-b2-c3",
    };
    for (const char *b : bad)
        if (parse_gid(b)) mctest::record_failure(__FILE__, __LINE__, std::string("accepted: ") + b);
    std::string embedded_nul("fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3\0", 48);
    CHECK(!parse_gid(embedded_nul));
}

TEST(rdma_gid_predicates) {
    CHECK(gid_is_zero(Gid{}));
    CHECK(!gid_is_zero(gid_of(kIbGid)));
    CHECK(gid_is_ipv4_mapped(gid_of(kV4Private)));
    CHECK(!gid_is_ipv4_mapped(gid_of(kLinkLocal)));
    CHECK(gid_is_link_local(gid_of(kLinkLocal)));
    CHECK(gid_is_link_local(gid_of("fe:bf:00:00:00:00:00:00:00:00:00:00:00:00:00:01")));
    CHECK(!gid_is_link_local(gid_of("fe:c0:00:00:00:00:00:00:00:00:00:00:00:00:00:01")));
    CHECK(gid_has_eui64_marker(gid_of(kLinkLocal)));
    CHECK(!gid_has_eui64_marker(gid_of(kIbGid)));
    struct {
        const char *ip_bytes;  // last four bytes
        bool priv;
    } v4[] = {{"0a:01:02:03", true},  {"ac:10:00:01", true},  {"ac:1f:ff:ff", true},
              {"ac:20:00:01", false}, {"ac:0f:00:01", false}, {"64:40:00:01", true},
              {"64:7f:ff:ff", true},  {"64:80:00:01", false}, {"c0:a8:00:01", false},
              {"08:08:08:08", false}};
    for (const auto &c : v4) {
        std::string text = std::string("00:00:00:00:00:00:00:00:00:00:ff:ff:") + c.ip_bytes;
        if (gid_is_private_ipv4(gid_of(text.c_str())) != c.priv)
            mctest::record_failure(__FILE__, __LINE__, "private v4 wrong for " + text);
    }
    // Not IPv4-mapped: never "private v4", whatever the last bytes say.
    CHECK(!gid_is_private_ipv4(gid_of("00:00:00:00:00:00:00:00:00:00:00:00:0a:00:00:01")));
}

TEST(rdma_gid_type_from_sysfs) {
    CHECK(gid_type_from_sysfs("RoCE v2\n", false) == GidType::RoCEv2);
    CHECK(gid_type_from_sysfs("RoCE v2", true) == GidType::RoCEv2);
    CHECK(gid_type_from_sysfs("IB/RoCE v1\n", true) == GidType::IB);
    CHECK(gid_type_from_sysfs("IB/RoCE v1", false) == GidType::RoCEv1);
    CHECK(gid_type_from_sysfs("", false) == GidType::Unknown);
    CHECK(gid_type_from_sysfs("RoCE v3", false) == GidType::Unknown);
}

TEST(rdma_gid_priority_classes) {
    struct Case {
        const char *gid;
        GidType type;
        const char *netdev;
        bool queryable;
        int cls;
    } cases[] = {
        {kGlobalV6, GidType::RoCEv2, "eth0", true, 1},
        {kV4Public, GidType::RoCEv2, "eth0", true, 1},
        {kIbGid, GidType::IB, "", true, 2},   // IB link-local prefix is normal, not degraded
        {kIbGid, GidType::IB, "ib0", true, 1},
        {kV4Public, GidType::RoCEv2, "", true, 2},
        {kV4Private, GidType::RoCEv2, "eth1", true, 3},
        {kV4Private, GidType::RoCEv2, "docker0", true, 4},  // degraded wins over private
        {kV4Public, GidType::RoCEv2, "flannel.1", true, 4},
        {kV4Public, GidType::RoCEv2, "cni0", true, 4},
        {kV4Public, GidType::RoCEv2, "calico123", true, 4},
        {kV4Public, GidType::RoCEv2, "vxlan.calico", true, 4},
        {kV4Public, GidType::RoCEv2, "tunl0", true, 4},
        {kLinkLocal, GidType::RoCEv2, "eth0", true, 4},  // link-local RoCEv2
        {kV4Private, GidType::RoCEv2, "", true, 5},
        {kLinkLocal, GidType::RoCEv2, "", true, 6},
        {kV4Public, GidType::RoCEv1, "eth0", true, 7},
        {kV4Public, GidType::Unknown, "", true, 7},
        {kV4Public, GidType::RoCEv2, "eth0", false, 0},
        {"00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00", GidType::RoCEv2, "eth0", true, 0},
    };
    for (const auto &c : cases) {
        GidEntry e;
        e.gid = gid_of(c.gid);
        e.type = c.type;
        e.netdev = c.netdev;
        e.queryable = c.queryable;
        int got = gid_priority_class(e);
        if (got != c.cls)
            mctest::record_failure(__FILE__, __LINE__,
                                   std::string("class of ") + c.gid + "/" + gid_type_name(c.type) +
                                       "/" + c.netdev + ": got " + std::to_string(got) +
                                       ", want " + std::to_string(c.cls));
    }
}

namespace {
GidEntry entry(int index, const char *gid, GidType type, const char *netdev, bool q = true) {
    GidEntry e;
    e.index = index;
    e.gid = gid_of(gid);
    e.type = type;
    e.netdev = netdev;
    e.queryable = q;
    return e;
}
}  // namespace

TEST(rdma_gid_auto_selection) {
    // A typical RoCE port: v1/v2 link-local, v1/v2 private v4, docker bridge.
    std::vector<GidEntry> t = {
        entry(0, kLinkLocal, GidType::RoCEv1, "eth0"),
        entry(1, kLinkLocal, GidType::RoCEv2, "eth0"),
        entry(2, kV4Private, GidType::RoCEv1, "eth0"),
        entry(3, kV4Private, GidType::RoCEv2, "eth0"),
        entry(4, kV4Private, GidType::RoCEv2, "docker0"),
    };
    auto s = select_gid_auto(t);
    REQUIRE(s.has_value());
    CHECK_EQ(s->index, 3);
    CHECK_EQ(s->priority_class, 3);
    CHECK(s->type == GidType::RoCEv2);
    CHECK(!s->forced);
    // A routable entry beats it even at a higher index.
    t.push_back(entry(9, kV4Public, GidType::RoCEv2, "eth0"));
    CHECK_EQ(select_gid_auto(t)->index, 9);
    // Ties go to the lowest index, whatever the table order.
    std::vector<GidEntry> ties = {entry(7, kV4Public, GidType::RoCEv2, "eth0"),
                                  entry(5, kGlobalV6, GidType::RoCEv2, "eth1"),
                                  entry(6, kV4Public, GidType::RoCEv2, "eth0")};
    CHECK_EQ(select_gid_auto(ties)->index, 5);
    // Only RoCEv1: fallback class 7, first non-zero queryable.
    std::vector<GidEntry> v1 = {entry(0, "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00",
                                      GidType::RoCEv1, "eth0"),
                                entry(1, kV4Public, GidType::RoCEv1, "eth0", false),
                                entry(2, kV4Public, GidType::RoCEv1, "eth0"),
                                entry(3, kV4Private, GidType::RoCEv1, "eth0")};
    auto f = select_gid_auto(v1);
    REQUIRE(f.has_value());
    CHECK_EQ(f->index, 2);
    CHECK_EQ(f->priority_class, 7);
    // Nothing usable.
    std::vector<GidEntry> none = {entry(0, "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00",
                                        GidType::RoCEv2, "eth0"),
                                  entry(1, kV4Public, GidType::RoCEv2, "eth0", false)};
    CHECK(!select_gid_auto(none));
    CHECK(!select_gid_auto({}));
}

TEST(rdma_gid_index_override_parsing) {
    using O = std::optional<std::string>;
    struct Case {
        O mc, nccl;
        int index;
        const char *var;
    } ok[] = {
        {std::nullopt, std::nullopt, -1, ""},
        {O("3"), std::nullopt, 3, "MC_GID_INDEX"},
        {O(" 7 "), O("1"), 7, "MC_GID_INDEX"},
        {O("0"), std::nullopt, 0, "MC_GID_INDEX"},
        {O("255"), std::nullopt, 255, "MC_GID_INDEX"},
        {std::nullopt, O("5"), 5, "NCCL_IB_GID_INDEX"},
        {O(""), O("5"), 5, "NCCL_IB_GID_INDEX"},   // empty MC_GID_INDEX = unset
        {O("-1"), O("5"), -1, ""},                  // explicit auto hides NCCL's
        {std::nullopt, O("-1"), -1, ""},            // NCCL's own "auto"
    };
    for (const auto &c : ok) {
        auto ov = parse_gid_index_override(c.mc, c.nccl);
        if (ov.index != c.index || ov.variable != c.var)
            mctest::record_failure(__FILE__, __LINE__,
                                   "override mc=" + c.mc.value_or("(unset)") + " nccl=" +
                                       c.nccl.value_or("(unset)") + " gave " +
                                       std::to_string(ov.index) + "/" + ov.variable);
    }
    struct Bad {
        O mc, nccl;
        const char *var;
    } bad[] = {{O("256"), std::nullopt, "MC_GID_INDEX"},  {O("abc"), std::nullopt, "MC_GID_INDEX"},
               {O("-2"), std::nullopt, "MC_GID_INDEX"},   {O("+1"), std::nullopt, "MC_GID_INDEX"},
               {O("1.5"), std::nullopt, "MC_GID_INDEX"},  {O("0x3"), std::nullopt, "MC_GID_INDEX"},
               {O("99999999999999999999"), std::nullopt, "MC_GID_INDEX"},
               {std::nullopt, O("x"), "NCCL_IB_GID_INDEX"}, {O("3 4"), std::nullopt, "MC_GID_INDEX"}};
    for (const auto &b : bad) {
        bool threw = false;
        try {
            parse_gid_index_override(b.mc, b.nccl);
        } catch (const Error &e) {
            threw = e.code() == mcrs::kErrInvalidArgument &&
                    std::string(e.what()).find(b.var) != std::string::npos &&
                    std::string(e.what()).find("0..255") != std::string::npos;
        }
        if (!threw)
            mctest::record_failure(__FILE__, __LINE__,
                                   "no clear error for mc=" + b.mc.value_or("(unset)") +
                                       " nccl=" + b.nccl.value_or("(unset)"));
    }
}

TEST(rdma_gid_forced_index) {
    std::vector<GidEntry> t = {
        entry(0, kLinkLocal, GidType::RoCEv1, "eth0"),
        entry(1, kLinkLocal, GidType::RoCEv2, "eth0"),
        entry(2, "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00", GidType::RoCEv2, "eth0"),
        entry(3, kV4Private, GidType::RoCEv2, "eth0"),
    };
    GidIndexOverride ov{1, "MC_GID_INDEX"};
    GidSelection s = select_gid(t, ov, "mlx5_0", 1);
    CHECK_EQ(s.index, 1);
    CHECK(s.forced);
    CHECK_EQ(format_gid(s.gid), std::string(kLinkLocal));
    auto expect_error = [&](int index, const char *needle) {
        try {
            select_gid(t, GidIndexOverride{index, "MC_GID_INDEX"}, "mlx5_0", 1);
            mctest::record_failure(__FILE__, __LINE__, "forced index " + std::to_string(index) + " accepted");
        } catch (const Error &e) {
            std::string m = e.what();
            CHECK_EQ(e.code(), int(mcrs::kErrContext));
            if (m.find(needle) == std::string::npos || m.find("mlx5_0 port 1") == std::string::npos ||
                m.find("MC_GID_INDEX=" + std::to_string(index)) == std::string::npos)
                mctest::record_failure(__FILE__, __LINE__, "unclear message: " + m);
        }
    };
    expect_error(2, "zero");
    expect_error(9, "no GID at that index");
    // Automatic: the private RoCEv2 entry.
    CHECK_EQ(select_gid(t, GidIndexOverride{}, "mlx5_0", 1).index, 3);
    try {
        select_gid({}, GidIndexOverride{}, "mlx5_3", 2);
        mctest::record_failure(__FILE__, __LINE__, "empty table accepted");
    } catch (const Error &e) {
        CHECK(std::string(e.what()).find("mlx5_3 port 2 has no usable GID") != std::string::npos);
    }
}

TEST(rdma_peer_link_layer_rule) {
    struct Case {
        const char *key;
        uint32_t lid;
        const char *gid;
        LinkLayer want;
    } cases[] = {
        {"RoCE", 7, kIbGid, LinkLayer::RoCE},       // explicit key wins
        {"ib", 0, kV4Private, LinkLayer::IB},
        {"InfiniBand", 0, "", LinkLayer::IB},
        {"Ethernet", 0, "", LinkLayer::RoCE},
        {"", 1, kIbGid, LinkLayer::IB},             // LID means IB
        {"", 12, kV4Private, LinkLayer::IB},
        {"bogus", 3, kIbGid, LinkLayer::IB},        // unparsable key ignored
        {"", 0, kV4Private, LinkLayer::RoCE},       // IPv4-mapped
        {"", 0, kV4Public, LinkLayer::RoCE},
        {"", 0, kGlobalV6, LinkLayer::RoCE},        // routable IPv6, no LID
        {"", 0, kLinkLocal, LinkLayer::RoCE},       // EUI-64 from a MAC
        {"", 0, kIbGid, LinkLayer::Unknown},        // GUID-like, no LID
        {"", 0, "", LinkLayer::Unknown},
        {"", 0, "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00", LinkLayer::Unknown},
        {"", 0, "not a gid", LinkLayer::Unknown},
    };
    for (const auto &c : cases) {
        LinkLayer got = infer_peer_link_layer(c.key, c.lid, c.gid);
        if (got != c.want)
            mctest::record_failure(__FILE__, __LINE__,
                                   std::string("key=") + c.key + " lid=" + std::to_string(c.lid) +
                                       " gid=" + c.gid + ": got " + link_layer_name(got));
    }
    CHECK(parse_link_layer(" InfiniBand\n") == LinkLayer::IB);
    CHECK(parse_link_layer("ETHERNET") == LinkLayer::RoCE);
    CHECK(parse_link_layer("") == LinkLayer::Unknown);
    CHECK_EQ(std::string(link_layer_name(LinkLayer::RoCE)), std::string("RoCE"));
}
