#include "common/error.h"
#include "core/segment_descriptor.h"
#include "test_util.h"
#include "transport/rdma/nic_filter.h"

using namespace mcrs::rdma;
using mcrs::Error;
using mcrs::Json;

namespace {

using Names = std::vector<std::string>;

std::string joined(const Names &v) {
    std::string s;
    for (const auto &n : v) s += (s.empty() ? "" : ",") + n;
    return s;
}

}  // namespace

TEST(rdma_filter_allow_deny_env) {
    Names found = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
    struct Case {
        Names allow, deny, env;
        const char *kept;
    } cases[] = {
        {{}, {}, {}, "mlx5_0,mlx5_1,mlx5_2,mlx5_3"},
        {{"mlx5_2", "mlx5_0"}, {}, {}, "mlx5_0,mlx5_2"},  // discovery order kept
        {{}, {"mlx5_1"}, {}, "mlx5_0,mlx5_2,mlx5_3"},
        {{}, {}, {"mlx5_3"}, "mlx5_3"},
        {{"mlx5_0", "mlx5_1"}, {}, {"mlx5_1", "mlx5_2"}, "mlx5_1"},  // both lists apply
        {{"mlx5_0", "mlx5_1"}, {"mlx5_0"}, {}, "mlx5_1"},           // deny beats allow
        {{"mlx5_0", "mlx5_1"}, {}, {"mlx5_0", "mlx5_1"}, "mlx5_0,mlx5_1"},  // same list twice
    };
    for (const auto &c : cases) {
        NicFilterResult r = filter_devices(found, c.allow, c.deny, c.env);
        if (joined(r.kept) != c.kept)
            mctest::record_failure(__FILE__, __LINE__, "kept " + joined(r.kept) + ", want " + c.kept);
        CHECK_EQ(r.kept.size() + r.removed.size(), found.size());
        CHECK(r.warning.empty());
    }
}

TEST(rdma_filter_unknown_names_and_empty_result) {
    Names found = {"mlx5_0", "mlx5_1"};
    NicFilterResult r = filter_devices(found, {"mlx5_0", "mlx5_O"}, {"ib9"}, {});
    CHECK(r.kept == Names{"mlx5_0"});
    CHECK((r.unknown_names == Names{"mlx5_O", "ib9"}));
    CHECK(r.warning.find("device allow-list names mlx5_O") != std::string::npos);
    CHECK(r.warning.find("device deny-list names ib9") != std::string::npos);
    CHECK(r.warning.find("found: mlx5_0,mlx5_1") != std::string::npos);
    try {
        filter_devices(found, {"mlx5_7"}, {}, {"mlx5_0"});
        mctest::record_failure(__FILE__, __LINE__, "empty result accepted");
    } catch (const Error &e) {
        std::string m = e.what();
        CHECK_EQ(e.code(), int(mcrs::kErrDeviceNotFound));
        CHECK(m.find("found mlx5_0,mlx5_1") != std::string::npos);
        CHECK(m.find("allow-list=[mlx5_7]") != std::string::npos);
        CHECK(m.find("MC_TE_FILTERS=[mlx5_0]") != std::string::npos);
    }
    // Nothing discovered: not this function's error.
    NicFilterResult none = filter_devices({}, {"mlx5_0"}, {}, {});
    CHECK(none.kept.empty());
    CHECK(!none.warning.empty());
}

TEST(rdma_link_plan_table) {
    const LinkLayer IB = LinkLayer::IB, RE = LinkLayer::RoCE, UN = LinkLayer::Unknown;
    std::vector<NicLink> ib2 = {{"mlx5_0", IB}, {"mlx5_1", IB}};
    std::vector<NicLink> roce1 = {{"mlx5_4", RE}};
    std::vector<NicLink> mixed = {{"mlx5_0", IB}, {"mlx5_2", RE}, {"mlx5_1", IB}};
    std::vector<NicLink> unknown = {{"x0", UN}};
    struct Case {
        const char *what;
        const std::vector<NicLink> &local, &peer;
        LinkLayer ll;
        std::vector<size_t> l, p;
    } cases[] = {
        {"ib-ib", ib2, ib2, IB, {0, 1}, {0, 1}},
        {"mixed-mixed settles on IB", mixed, mixed, IB, {0, 2}, {0, 2}},
        {"mixed-roce uses the RoCE NIC", mixed, roce1, RE, {1}, {0}},
        {"roce-mixed", roce1, mixed, RE, {0}, {1}},
        {"ib-unknown peer", ib2, unknown, IB, {0, 1}, {0}},
        {"mixed-unknown picks IB", mixed, unknown, IB, {0, 2}, {0}},
    };
    for (const auto &c : cases) {
        LinkPlan p = plan_link_layer(c.local, c.peer, "10.0.0.2:15000");
        if (p.link_layer != c.ll || p.local != c.l || p.peer != c.p)
            mctest::record_failure(__FILE__, __LINE__, std::string("plan wrong: ") + c.what);
    }
    // Symmetry: both engines choose the same layer from each other's view.
    CHECK(plan_link_layer(mixed, roce1, "p").link_layer == plan_link_layer(roce1, mixed, "p").link_layer);
    // Unknown peers are marked.
    CHECK(plan_link_layer(ib2, unknown, "p").uses_unknown_peers);
    CHECK(!plan_link_layer(ib2, ib2, "p").uses_unknown_peers);
    // Mixed peer with an unknown extra: IB pairs with IB and the unknown.
    std::vector<NicLink> peer_mixed_unknown = {{"a", RE}, {"b", UN}, {"c", IB}};
    LinkPlan mu = plan_link_layer(ib2, peer_mixed_unknown, "p");
    CHECK((mu.peer == std::vector<size_t>{1, 2}));
    // Nobody knows anything: allowed, not refused.
    LinkPlan uu = plan_link_layer(unknown, unknown, "p");
    CHECK(uu.link_layer == UN);
    CHECK_EQ(uu.local.size(), size_t(1));
}

TEST(rdma_link_plan_refuses_ib_with_roce) {
    std::vector<NicLink> ib = {{"mlx5_0", LinkLayer::IB}, {"mlx5_1", LinkLayer::IB}};
    std::vector<NicLink> roce = {{"mlx5_2", LinkLayer::RoCE}};
    for (int dir = 0; dir < 2; ++dir) {
        try {
            if (dir == 0) plan_link_layer(ib, roce, "10.0.0.2:15000");
            else plan_link_layer(roce, ib, "10.0.0.2:15000");
            mctest::record_failure(__FILE__, __LINE__, "IB paired with RoCE");
        } catch (const Error &e) {
            std::string m = e.what();
            CHECK_EQ(e.code(), int(mcrs::kErrDeviceNotFound));
            CHECK(m.find("10.0.0.2:15000") != std::string::npos);
            CHECK(m.find(dir == 0 ? "local NICs: IB (mlx5_0,mlx5_1)" : "local NICs: RoCE (mlx5_2)") !=
                  std::string::npos);
            CHECK(m.find(dir == 0 ? "peer NICs: RoCE (mlx5_2)" : "peer NICs: IB (mlx5_0,mlx5_1)") !=
                  std::string::npos);
            CHECK(m.find("MC_TE_FILTERS") != std::string::npos);
            CHECK(m.find("device_name") != std::string::npos);
        }
    }
    // An empty side is refused too, with "none".
    try {
        plan_link_layer(ib, {}, "p");
        mctest::record_failure(__FILE__, __LINE__, "empty peer accepted");
    } catch (const Error &e) {
        CHECK(std::string(e.what()).find("peer NICs: none") != std::string::npos);
    }
}

TEST(rdma_link_layer_from_descriptor) {
    mcrs::SegmentDesc d;
    d.name = "10.0.0.1:15000";
    d.protocol = "rdma";
    d.devices = {
        {"mlx5_0", "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c3", 5, ""},
        {"mlx5_1", "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01", 0, ""},
        {"mlx5_2", "fe:80:00:00:00:00:00:00:98:03:9b:03:00:a1:b2:c4", 0, "IB"},
    };
    // Our extension key survives the descriptor round trip; upstream-style
    // entries (no key) keep the three upstream keys only.
    Json j = mcrs::encode_segment_desc(d);
    const Json::Array *devs = j.find("devices")->get_array();
    REQUIRE(devs);
    CHECK((*devs)[0].find("mc_link_layer") == nullptr);
    CHECK_EQ(*(*devs)[2].find("mc_link_layer")->get_string(), std::string("IB"));
    mcrs::SegmentDesc back = mcrs::decode_segment_desc(Json::parse(j.dump()));
    std::vector<NicLink> links = peer_links_from_descriptor(back.devices);
    REQUIRE_EQ(links.size(), size_t(3));
    CHECK(links[0].link_layer == LinkLayer::IB);    // lid 5
    CHECK(links[1].link_layer == LinkLayer::RoCE);  // IPv4-mapped, lid 0
    CHECK(links[2].link_layer == LinkLayer::IB);    // declared
    // A hostile extension value is ignored, not trusted.
    Json h = Json::parse(
        "{\"name\":\"p:1\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"m\",\"gid\":\"g\",\"lid\":0,"
        "\"mc_link_layer\":5}],\"buffers\":[]}");
    CHECK_EQ(mcrs::decode_segment_desc(h).devices[0].link_layer, std::string(""));
}
