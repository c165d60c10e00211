// Helpers for tests that run the verbs layer against softverbs, the
// software RDMA stand-in: its control functions, RAII device/QP wrappers
// and a connect helper doing the RESET -> INIT -> RTR -> RTS dance the way
// the RDMA transport does (always-global address vector, PSN 0).
#pragma once

#include <fcntl.h>
#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "../softverbs/softverbs_control.h"
#include "test_util.h"
#include "transport/rdma/verbs_loader.h"

#ifndef MC_SOFTVERBS_PATH
#error "MC_SOFTVERBS_PATH must name libmc_softverbs.so (set by the Makefile)"
#endif

namespace svtest {

namespace ibv = mcrs::ibv;

struct Controls {
    const ibv::VerbsLibrary *lib = nullptr;
    int (*configure)(const char *) = nullptr;
    int (*device_count)() = nullptr;
    const char *(*sysfs_root)() = nullptr;
    int (*set_port_state)(const char *, int) = nullptr;
    int (*set_gid)(const char *, int, const uint8_t *) = nullptr;
    int (*inject_wc_error)(const char *, const char *, int, int) = nullptr;
    int (*set_qp_error)(const char *, uint32_t) = nullptr;
    int (*add_efault_range)(uint64_t, uint64_t) = nullptr;
    void (*clear_efault_ranges)() = nullptr;
    int (*set_paused)(const char *, int) = nullptr;
    int (*drop_completions)(const char *, int) = nullptr;
    void (*reset_faults)() = nullptr;
    int (*get_counters)(const char *, mc_softverbs_counters *) = nullptr;
    void (*reset_counters)() = nullptr;
    int (*pending)(const char *) = nullptr;
    int (*find_mr)(const char *, uint64_t, mc_softverbs_mr_info *) = nullptr;

    const ibv::VerbsApi &api() const { return lib->api(); }
};

template <class F>
void bind(const ibv::VerbsLibrary &lib, const char *name, F &fn) {
    fn = reinterpret_cast<F>(lib.symbol(name));
    if (!fn) throw std::runtime_error(std::string("softverbs lacks ") + name);
}

// Where the stand-in is: env MC_SOFTVERBS_PATH (the GPU lane's bundle,
// run away from the build tree), else the library the Makefile built.
inline const char *softverbs_path() {
    const char *env = std::getenv("MC_SOFTVERBS_PATH");
    return env && *env ? env : MC_SOFTVERBS_PATH;
}

// The stand-in, loaded once, with every control resolved.
inline Controls &sv() {
    static Controls c = [] {
        Controls k;
        k.lib = &ibv::VerbsLibrary::load(softverbs_path());
        bind(*k.lib, "mc_softverbs_configure", k.configure);
        bind(*k.lib, "mc_softverbs_device_count", k.device_count);
        bind(*k.lib, "mc_softverbs_sysfs_root", k.sysfs_root);
        bind(*k.lib, "mc_softverbs_set_port_state", k.set_port_state);
        bind(*k.lib, "mc_softverbs_set_gid", k.set_gid);
        bind(*k.lib, "mc_softverbs_inject_wc_error", k.inject_wc_error);
        bind(*k.lib, "mc_softverbs_set_qp_error", k.set_qp_error);
        bind(*k.lib, "mc_softverbs_add_efault_range", k.add_efault_range);
        bind(*k.lib, "mc_softverbs_clear_efault_ranges", k.clear_efault_ranges);
        bind(*k.lib, "mc_softverbs_set_paused", k.set_paused);
        bind(*k.lib, "mc_softverbs_drop_completions", k.drop_completions);
        bind(*k.lib, "mc_softverbs_reset_faults", k.reset_faults);
        bind(*k.lib, "mc_softverbs_get_counters", k.get_counters);
        bind(*k.lib, "mc_softverbs_reset_counters", k.reset_counters);
        bind(*k.lib, "mc_softverbs_pending", k.pending);
        bind(*k.lib, "mc_softverbs_find_mr", k.find_mr);
        return k;
    }();
    return c;
}

// Configures the stand-in for one test (no context may be open).
inline void configure(const char *spec) {
    REQUIRE_EQ(sv().configure(spec), 0);
    sv().reset_faults();
    sv().reset_counters();
}

// An open device with one PD and one CQ.
struct Dev {
    const ibv::VerbsApi &api = sv().api();
    std::string name;
    ibv::context *ctx = nullptr;
    ibv::pd *pd = nullptr;
    ibv::cq *cq = nullptr;
    ibv::port_attr port{};
    ibv::gid gid{};
    int gid_index = 0;

    explicit Dev(const std::string &want, int cqe = 4096) : name(want) {
        int n = 0;
        ibv::device **list = api.get_device_list(&n);
        REQUIRE(list != nullptr);
        for (int i = 0; i < n && !ctx; ++i)
            if (want == api.get_device_name(list[i])) ctx = api.open_device(list[i]);
        api.free_device_list(list);
        REQUIRE(ctx != nullptr);
        REQUIRE_EQ(sv().lib->query_port(ctx, 1, &port), 0);
        // RoCE: index 1 is the first RoCE v2 entry; IB: index 0.
        gid_index = port.link_layer == ibv::IBV_LINK_LAYER_ETHERNET ? 1 : 0;
        REQUIRE_EQ(api.query_gid(ctx, 1, gid_index, &gid), 0);
        pd = api.alloc_pd(ctx);
        REQUIRE(pd != nullptr);
        cq = api.create_cq(ctx, cqe, this, nullptr, 0);
        REQUIRE(cq != nullptr);
    }
    ~Dev() {
        if (cq) CHECK_EQ(api.destroy_cq(cq), 0);
        if (pd) CHECK_EQ(api.dealloc_pd(pd), 0);
        if (ctx) CHECK_EQ(api.close_device(ctx), 0);
    }
    Dev(const Dev &) = delete;
    Dev &operator=(const Dev &) = delete;
};

struct Mr {
    const ibv::VerbsApi &api = sv().api();
    ibv::mr *mr = nullptr;
    Mr(Dev &d, void *addr, size_t len, int access) { mr = sv().lib->reg_mr(d.pd, addr, len, access); }
    ~Mr() {
        if (mr) CHECK_EQ(api.dereg_mr(mr), 0);
    }
    Mr(const Mr &) = delete;
    Mr &operator=(const Mr &) = delete;
};

struct Qp {
    const ibv::VerbsApi &api = sv().api();
    ibv::qp *qp = nullptr;
    explicit Qp(Dev &d, uint32_t max_send_wr = 256, ibv::cq *cq = nullptr) {
        ibv::qp_init_attr init{};
        init.send_cq = cq ? cq : d.cq;
        init.recv_cq = cq ? cq : d.cq;
        init.cap.max_send_wr = max_send_wr;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 4;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = 64;
        init.qp_type = ibv::IBV_QPT_RC;
        init.sq_sig_all = 0;
        qp = api.create_qp(d.pd, &init);
        REQUIRE(qp != nullptr);
    }
    ~Qp() {
        if (qp) CHECK_EQ(api.destroy_qp(qp), 0);
    }
    Qp(const Qp &) = delete;
    Qp &operator=(const Qp &) = delete;

    int state() const {
        ibv::qp_attr a{};
        ibv::qp_init_attr i{};
        api.query_qp(qp, &a, ibv::IBV_QP_STATE, &i);
        return a.qp_state;
    }
};

constexpr int kAllAccess = ibv::IBV_ACCESS_LOCAL_WRITE | ibv::IBV_ACCESS_REMOTE_READ |
                           ibv::IBV_ACCESS_REMOTE_WRITE | ibv::IBV_ACCESS_REMOTE_ATOMIC;

inline int to_init(const ibv::VerbsApi &api, ibv::qp *q) {
    ibv::qp_attr a{};
    a.qp_state = ibv::IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    a.qp_access_flags = kAllAccess;
    return api.modify_qp(q, &a, ibv::IBV_QP_STATE | ibv::IBV_QP_PKEY_INDEX | ibv::IBV_QP_PORT |
                                    ibv::IBV_QP_ACCESS_FLAGS);
}

inline ibv::qp_attr rtr_attr(const Dev &self, const Dev &peer, uint32_t peer_qpn) {
    ibv::qp_attr a{};
    a.qp_state = ibv::IBV_QPS_RTR;
    a.path_mtu = self.port.active_mtu < ibv::IBV_MTU_4096 ? self.port.active_mtu : ibv::IBV_MTU_4096;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(self.gid_index);
    a.ah_attr.grh.hop_limit = 16;
    a.ah_attr.dlid = peer.port.lid;
    a.ah_attr.port_num = 1;
    return a;
}

constexpr int kRtrMask = ibv::IBV_QP_STATE | ibv::IBV_QP_AV | ibv::IBV_QP_PATH_MTU | ibv::IBV_QP_DEST_QPN |
                         ibv::IBV_QP_RQ_PSN | ibv::IBV_QP_MAX_DEST_RD_ATOMIC | ibv::IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsMask = ibv::IBV_QP_STATE | ibv::IBV_QP_TIMEOUT | ibv::IBV_QP_RETRY_CNT |
                         ibv::IBV_QP_RNR_RETRY | ibv::IBV_QP_SQ_PSN | ibv::IBV_QP_MAX_QP_RD_ATOMIC;

inline int to_rts(const ibv::VerbsApi &api, ibv::qp *q) {
    ibv::qp_attr a{};
    a.qp_state = ibv::IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 16;
    return api.modify_qp(q, &a, kRtsMask);
}

// Moves one QP to RTS against a peer QP.
inline void bring_up(Dev &self, Qp &q, Dev &peer, Qp &pq) {
    const ibv::VerbsApi &api = self.api;
    REQUIRE_EQ(to_init(api, q.qp), 0);
    ibv::qp_attr a = rtr_attr(self, peer, pq.qp->qp_num);
    REQUIRE_EQ(api.modify_qp(q.qp, &a, kRtrMask), 0);
    REQUIRE_EQ(to_rts(api, q.qp), 0);
}

inline void connect(Dev &da, Qp &a, Dev &db, Qp &b) {
    bring_up(da, a, db, b);
    bring_up(db, b, da, a);
}

// Polls `cq` until one completion arrives (false after `ms`).
inline bool wait_wc(ibv::cq *cq, ibv::wc &out, int ms = 5000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
        int n = ibv::poll_cq(cq, 1, &out);
        if (n == 1) return true;
        if (n < 0) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;
}

// Waits for an async event on `ctx` (false after `ms`).
inline bool wait_event(const ibv::VerbsApi &api, ibv::context *ctx, ibv::async_event &ev, int ms = 5000) {
    int fl = fcntl(ctx->async_fd, F_GETFL);
    fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
    pollfd p{ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    int rc = api.get_async_event(ctx, &ev);
    if (rc == 0) api.ack_async_event(&ev);
    return rc == 0;
}

// Posts one RDMA READ or WRITE with a single SGE.
inline int post_rdma(ibv::qp *q, int opcode, void *local, uint32_t len, uint32_t lkey, uint64_t remote,
                     uint32_t rkey, uint64_t wr_id, bool signaled = true) {
    ibv::sge s{reinterpret_cast<uintptr_t>(local), len, lkey};
    ibv::send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = static_cast<ibv::wr_opcode>(opcode);
    wr.send_flags = signaled ? ibv::IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv::send_wr *bad = nullptr;
    return ibv::post_send(q, &wr, &bad);
}

inline uint64_t addr(const void *p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace svtest
