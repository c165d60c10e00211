// softverbs, the software RDMA stand-in, driven through the verbs loader:
// device/port/GID queries against the spec, the fake sysfs, configuration
// errors, MRs and the QP state machine. Data movement, error completions
// and fault injection are in test_softverbs_data.cpp.
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "softverbs_pair.h"

using namespace svtest;
using namespace svpair;

namespace {

const char *kSpec = "sv0:ib:numa=0,sv1:roce:numa=1,sv2:roce:numa=0:gids=4:ipv4=198.51.100.7:mtu=4096,"
                    "sv3:ib:numa=1:pci=0000:af:00.1";

bool exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

std::string base_of_realpath(const std::string &path) {
    char buf[PATH_MAX];
    if (!realpath(path.c_str(), buf)) return "";
    std::string r(buf);
    return r.substr(r.rfind('/') + 1);
}

}  // namespace

TEST(softverbs_devices_ports_and_gids_follow_the_spec) {
    configure(kSpec);
    const ibv::VerbsApi &api = sv().api();
    int n = 0;
    ibv::device **list = api.get_device_list(&n);
    REQUIRE(list != nullptr);
    REQUIRE_EQ(n, 4);
    CHECK(list[4] == nullptr);
    CHECK_EQ(std::string(api.get_device_name(list[2])), std::string("sv2"));
    CHECK_EQ(std::string(list[1]->dev_name), std::string("uverbs1"));
    api.free_device_list(list);
    CHECK_EQ(sv().device_count(), 4);

    Dev ib("sv0"), roce("sv1"), roce2("sv2");
    ibv::device_attr da{};
    REQUIRE_EQ(api.query_device(ib.ctx, &da), 0);
    CHECK_EQ(static_cast<int>(da.phys_port_cnt), 1);
    CHECK(da.max_qp > 1000 && da.max_cqe >= 65535 && da.max_qp_wr >= 256 && da.max_sge >= 4);
    CHECK(da.max_mr_size > (1ull << 40));
    CHECK_EQ(da.max_qp_rd_atom, 16);

    CHECK_EQ(static_cast<int>(ib.port.state), static_cast<int>(ibv::IBV_PORT_ACTIVE));
    CHECK_EQ(static_cast<int>(ib.port.link_layer), static_cast<int>(ibv::IBV_LINK_LAYER_INFINIBAND));
    CHECK_EQ(static_cast<int>(ib.port.active_mtu), static_cast<int>(ibv::IBV_MTU_4096));
    CHECK_EQ(ib.port.lid, 1);
    CHECK_EQ(static_cast<int>(roce.port.link_layer), static_cast<int>(ibv::IBV_LINK_LAYER_ETHERNET));
    CHECK_EQ(roce.port.lid, 0);
    CHECK_EQ(static_cast<int>(roce.port.active_mtu), static_cast<int>(ibv::IBV_MTU_1024));
    CHECK_EQ(static_cast<int>(roce2.port.active_mtu), static_cast<int>(ibv::IBV_MTU_4096));
    CHECK_EQ(roce.port.gid_tbl_len, 16);
    CHECK(roce.port.port_cap_flags & ibv::IBV_PORT_IP_BASED_GIDS);
    CHECK_EQ(sv().lib->query_port(ib.ctx, 2, &ib.port), EINVAL);

    ibv::gid g{};
    REQUIRE_EQ(api.query_gid(ib.ctx, 1, 0, &g), 0);
    CHECK_EQ(static_cast<int>(g.raw[0]), 0xfe);
    CHECK_EQ(static_cast<int>(g.raw[1]), 0x80);
    REQUIRE_EQ(api.query_gid(ib.ctx, 1, 1, &g), 0);  // empty entry reads as zero
    CHECK_EQ(static_cast<int>(g.raw[0]), 0);
    CHECK_EQ(api.query_gid(ib.ctx, 1, 16, &g), -1);
    ibv::gid g0{}, g1{};
    api.query_gid(roce.ctx, 1, 0, &g0);
    api.query_gid(roce.ctx, 1, 1, &g1);
    CHECK(std::memcmp(g0.raw, g1.raw, 16) == 0);  // v1/v2 pair share the address
    CHECK_EQ(static_cast<int>(g0.raw[0]), 0xfe);
    REQUIRE_EQ(api.query_gid(roce2.ctx, 1, 3, &g), 0);
    const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 51, 100, 7};
    CHECK(std::memcmp(g.raw, mapped, 16) == 0);
    CHECK(std::memcmp(ib.gid.raw, roce.gid.raw, 16) != 0);
}

TEST(softverbs_fake_sysfs_has_the_real_layout) {
    configure(kSpec);
    const ibv::VerbsApi &api = sv().api();
    int n = 0;
    ibv::device **list = api.get_device_list(&n);
    REQUIRE_EQ(n, 4);
    std::string root = sv().sysfs_root();
    const char *numa[] = {"0", "1", "0", "1"};
    for (int i = 0; i < n; ++i) {
        std::string ib = list[i]->ibdev_path;
        std::string name = list[i]->name;
        CHECK_EQ(ib, root + "/class/infiniband/" + name);
        std::string pci = base_of_realpath(ib + "/device");
        CHECK_EQ(pci, i == 3 ? std::string("0000:af:00.1") : "0000:1" + std::to_string(i) + ":00.0");
        CHECK_EQ(base_of_realpath(ib + "/../.."), pci);  // upstream's way to find the PCI device
        CHECK_EQ(read_text(ib + "/device/numa_node"), std::string(numa[i]));
        CHECK(exists(root + "/bus/pci/devices/" + pci + "/numa_node"));
        CHECK_EQ(read_text(std::string(list[i]->dev_path) + "/ibdev"), name);
        CHECK_EQ(read_text(ib + "/ports/1/state"), std::string("4: ACTIVE"));
    }
    std::string ib0 = list[0]->ibdev_path, roce1 = list[1]->ibdev_path, roce2 = list[2]->ibdev_path;
    api.free_device_list(list);
    CHECK_EQ(read_text(ib0 + "/ports/1/gid_attrs/types/0"), std::string("IB/RoCE v1"));
    CHECK(!exists(ib0 + "/ports/1/gid_attrs/ndevs/0"));
    CHECK(!exists(ib0 + "/ports/1/gid_attrs/types/1"));
    CHECK_EQ(read_text(ib0 + "/ports/1/link_layer"), std::string("InfiniBand"));
    CHECK_EQ(read_text(roce1 + "/ports/1/gid_attrs/types/0"), std::string("IB/RoCE v1"));
    CHECK_EQ(read_text(roce1 + "/ports/1/gid_attrs/types/1"), std::string("RoCE v2"));
    CHECK_EQ(read_text(roce1 + "/ports/1/gid_attrs/ndevs/1"), std::string("sveth1"));
    CHECK_EQ(read_text(roce1 + "/ports/1/link_layer"), std::string("Ethernet"));
    CHECK_EQ(read_text(roce2 + "/ports/1/gid_attrs/types/3"), std::string("RoCE v2"));
    CHECK(!exists(roce2 + "/ports/1/gid_attrs/types/4"));

    // A new configuration replaces the tree; $MC_SOFTVERBS_SYSFS picks the root.
    char tmpl[] = "/tmp/mc_sv_test.XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    std::string mine = std::string(tmpl) + "/sys";
    setenv("MC_SOFTVERBS_SYSFS", mine.c_str(), 1);
    configure("svx:roce:netdev=eth7");
    unsetenv("MC_SOFTVERBS_SYSFS");
    CHECK(!exists(root));
    CHECK_EQ(std::string(sv().sysfs_root()), mine);
    CHECK_EQ(read_text(mine + "/class/infiniband/svx/ports/1/gid_attrs/ndevs/0"), std::string("eth7"));
    configure(kSpec);
    CHECK(!exists(mine));  // created by softverbs, so removed by it
    rmdir(tmpl);
}

TEST(softverbs_rejects_bad_configurations) {
    CHECK_EQ(sv().configure("sv0"), EINVAL);
    CHECK_EQ(sv().configure("sv0:iwarp"), EINVAL);
    CHECK_EQ(sv().configure("sv0:ib,sv0:roce"), EINVAL);
    CHECK_EQ(sv().configure("sv0:roce:gids=17"), EINVAL);
    CHECK_EQ(sv().configure("sv0:roce:color=blue"), EINVAL);
    configure("sv0:roce");
    {
        Dev d("sv0");
        CHECK_EQ(sv().configure("sv9:ib"), EBUSY);  // a context is open
    }
    configure("sv0:roce");
}

TEST(softverbs_memory_regions_check_arguments_and_keys) {
    configure("sv0:roce:max_mr_size=1m,sv1:roce");
    Dev d("sv0"), e("sv1");
    const ibv::VerbsApi &api = d.api;
    std::vector<char> buf(1 << 16);
    errno = 0;
    CHECK(api.reg_mr(d.pd, buf.data(), 0, kAllAccess) == nullptr);
    CHECK_EQ(errno, EINVAL);
    CHECK(api.reg_mr(d.pd, buf.data(), buf.size(), ibv::IBV_ACCESS_REMOTE_WRITE) == nullptr);
    CHECK_EQ(errno, EINVAL);  // remote write needs local write
    CHECK(api.reg_mr(d.pd, nullptr, 4096, kAllAccess) == nullptr);
    CHECK_EQ(errno, EFAULT);
    CHECK(api.reg_mr(d.pd, buf.data(), (1 << 20) + 1, kAllAccess) == nullptr);
    CHECK_EQ(errno, EINVAL);  // above max_mr_size
    Mr a(d, buf.data(), 4096, kAllAccess), b(d, buf.data() + 4096, 4096, ibv::IBV_ACCESS_LOCAL_WRITE);
    Mr c(e, buf.data(), 4096, kAllAccess);
    REQUIRE(a.mr && b.mr && c.mr);
    CHECK(a.mr->addr == buf.data());
    CHECK_EQ(a.mr->length, size_t(4096));
    CHECK(a.mr->lkey != a.mr->rkey);
    CHECK(a.mr->lkey != b.mr->lkey && a.mr->rkey != c.mr->rkey);
    CHECK_EQ(api.dealloc_pd(d.pd), EBUSY);  // MRs still on it
}

TEST(softverbs_efault_knob_imitates_gpu_memory_without_peermem) {
    configure("sv0:roce");
    Dev d("sv0");
    std::vector<char> buf(16384);
    REQUIRE_EQ(sv().add_efault_range(addr(buf.data()) + 8192, 4096), 0);
    errno = 0;
    CHECK(sv().lib->reg_mr(d.pd, buf.data(), buf.size(), kAllAccess) == nullptr);
    CHECK_EQ(errno, EFAULT);
    CHECK(d.api.reg_mr(d.pd, buf.data() + 12287, 2, kAllAccess) == nullptr);
    CHECK_EQ(errno, EFAULT);
    {
        Mr ok(d, buf.data(), 8192, kAllAccess);
        CHECK(ok.mr != nullptr);
        // DMA-BUF registration is the way around it.
        int fd = dup(STDERR_FILENO);
        ibv::mr *dm = sv().lib->reg_dmabuf_mr(d.pd, 64, 4096, addr(buf.data()) + 8192, fd, kAllAccess);
        CHECK(dm != nullptr);
        if (dm) {
            CHECK(dm->addr == buf.data() + 8192);
            CHECK_EQ(d.api.dereg_mr(dm), 0);
        }
        close(fd);
    }
    sv().clear_efault_ranges();
    Mr all(d, buf.data(), buf.size(), kAllAccess);
    CHECK(all.mr != nullptr);
}

TEST(softverbs_qp_state_machine) {
    configure("sv0:roce,sv1:ib,sv2:ib");
    Dev d("sv0"), ib("sv1"), ib2("sv2");
    const ibv::VerbsApi &api = d.api;
    Qp q(d), p(d);
    CHECK_EQ(q.state(), static_cast<int>(ibv::IBV_QPS_RESET));
    ibv::qp_attr a = rtr_attr(d, d, p.qp->qp_num);
    CHECK_EQ(api.modify_qp(q.qp, &a, kRtrMask), EINVAL);  // RESET -> RTR
    ibv::qp_attr i{};
    i.qp_state = ibv::IBV_QPS_INIT;
    i.port_num = 1;
    i.qp_access_flags = kAllAccess;
    CHECK_EQ(api.modify_qp(q.qp, &i, ibv::IBV_QP_STATE | ibv::IBV_QP_PORT | ibv::IBV_QP_ACCESS_FLAGS), EINVAL);
    CHECK_EQ(api.modify_qp(q.qp, &i, ibv::IBV_QP_STATE | ibv::IBV_QP_PORT | ibv::IBV_QP_ACCESS_FLAGS |
                                         ibv::IBV_QP_PKEY_INDEX | ibv::IBV_QP_DEST_QPN),
             EINVAL);  // a bit RESET -> INIT does not take
    i.port_num = 2;
    CHECK_EQ(api.modify_qp(q.qp, &i, ibv::IBV_QP_STATE | ibv::IBV_QP_PORT | ibv::IBV_QP_ACCESS_FLAGS |
                                         ibv::IBV_QP_PKEY_INDEX),
             EINVAL);  // no port 2
    REQUIRE_EQ(to_init(api, q.qp), 0);
    CHECK_EQ(static_cast<int>(q.qp->state), static_cast<int>(ibv::IBV_QPS_INIT));
    CHECK_EQ(to_rts(api, q.qp), EINVAL);  // INIT -> RTS
    CHECK_EQ(api.modify_qp(q.qp, &a, kRtrMask & ~ibv::IBV_QP_MIN_RNR_TIMER), EINVAL);
    ibv::qp_attr local = a;
    local.ah_attr.is_global = 0;
    CHECK_EQ(api.modify_qp(q.qp, &local, kRtrMask), EINVAL);  // RoCE needs a GRH
    local = a;
    local.ah_attr.grh.sgid_index = 9;
    CHECK_EQ(api.modify_qp(q.qp, &local, kRtrMask), EINVAL);  // no such GID
    std::vector<char> buf(64);
    Mr m(d, buf.data(), buf.size(), kAllAccess);
    CHECK_EQ(post_rdma(q.qp, ibv::IBV_WR_RDMA_WRITE, buf.data(), 8, m.mr->lkey, addr(buf.data()), m.mr->rkey, 1),
             EINVAL);  // cannot post before RTS
    REQUIRE_EQ(api.modify_qp(q.qp, &a, kRtrMask), 0);
    CHECK_EQ(post_rdma(q.qp, ibv::IBV_WR_RDMA_WRITE, buf.data(), 8, m.mr->lkey, addr(buf.data()), m.mr->rkey, 1),
             EINVAL);
    REQUIRE_EQ(to_rts(api, q.qp), 0);
    ibv::qp_attr got{};
    ibv::qp_init_attr init{};
    REQUIRE_EQ(api.query_qp(q.qp, &got, ibv::IBV_QP_STATE, &init), 0);
    CHECK_EQ(static_cast<int>(got.qp_state), static_cast<int>(ibv::IBV_QPS_RTS));
    CHECK_EQ(got.dest_qp_num, p.qp->qp_num);
    CHECK_EQ(static_cast<int>(got.path_mtu), static_cast<int>(ibv::IBV_MTU_1024));
    CHECK_EQ(static_cast<int>(got.timeout), 14);
    CHECK_EQ(init.cap.max_send_wr, 256u);
    CHECK_EQ(init.sq_sig_all, 0);
    CHECK(init.send_cq == d.cq);
    ibv::qp_attr back{};
    back.qp_state = ibv::IBV_QPS_RTR;
    CHECK_EQ(api.modify_qp(q.qp, &back, ibv::IBV_QP_STATE), EINVAL);  // RTS -> RTR
    ibv::qp_attr err{};
    err.qp_state = ibv::IBV_QPS_ERR;
    REQUIRE_EQ(api.modify_qp(q.qp, &err, ibv::IBV_QP_STATE), 0);
    CHECK_EQ(to_init(api, q.qp), EINVAL);  // ERR -> INIT
    ibv::qp_attr reset{};
    reset.qp_state = ibv::IBV_QPS_RESET;
    REQUIRE_EQ(api.modify_qp(q.qp, &reset, ibv::IBV_QP_STATE), 0);
    CHECK_EQ(to_init(api, q.qp), 0);  // reusable after RESET

    // IB: LID-routed (no GRH) is allowed.
    Qp x(ib), y(ib2);
    REQUIRE_EQ(to_init(api, x.qp), 0);
    ibv::qp_attr lr = rtr_attr(ib, ib2, y.qp->qp_num);
    lr.ah_attr.is_global = 0;
    CHECK_EQ(api.modify_qp(x.qp, &lr, kRtrMask), 0);
}
