// RC queue pairs: creation and the RESET -> INIT -> RTR -> RTS state machine
// with the required/optional attribute masks of the IB spec (the table the
// kernel enforces in ib_modify_qp_is_ok), rejecting the rest with EINVAL.
#include <cstring>

#include "sv_state.h"

using namespace sv;

namespace {

constexpr int kMaxInline = 512;

struct Transition {
    int required;
    int optional;
};

// Attribute masks for an RC QP going from `cur` to `next`; false if the
// transition is illegal.
bool transition_masks(int cur, int next, Transition &t) {
    using namespace ibv;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
        t = {0, 0};
        return true;
    }
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        t = {IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
        return true;
    }
    if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
        t = {0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
        return true;
    }
    if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        t = {IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                 IBV_QP_MIN_RNR_TIMER,
             IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
        return true;
    }
    if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        t = {IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
             IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                 IBV_QP_PATH_MIG_STATE};
        return true;
    }
    if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
        t = {0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                    IBV_QP_MIN_RNR_TIMER};
        return true;
    }
    return false;
}

// Values the device would refuse.
bool attrs_valid(const Qp &q, const ibv::qp_attr &a, int mask) {
    using namespace ibv;
    const DeviceSpec &s = q.dev->spec;
    if ((mask & IBV_QP_PORT) && a.port_num != 1) return false;
    if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index >= (s.roce ? 1 : 128)) return false;
    const unsigned int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                IBV_ACCESS_REMOTE_ATOMIC;
    if ((mask & IBV_QP_ACCESS_FLAGS) && (a.qp_access_flags & ~remote)) return false;
    if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096)) return false;
    if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num > 0xffffff) return false;
    if (mask & IBV_QP_AV) {
        const ah_attr &av = a.ah_attr;
        if (av.port_num != 1) return false;
        if (s.roce && !av.is_global) return false;  // RoCE needs a GRH
        if (av.is_global && av.grh.sgid_index >= q.dev->gids.size()) return false;
    }
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > 16) return false;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > 16) return false;
    if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return false;
    if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return false;
    if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return false;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return false;
    return true;
}

void apply(Qp &q, const ibv::qp_attr &a, int mask) {
    using namespace ibv;
    if (mask & IBV_QP_PORT) q.port = a.port_num;
    if (mask & IBV_QP_PKEY_INDEX) q.pkey_index = a.pkey_index;
    if (mask & IBV_QP_ACCESS_FLAGS) q.access = a.qp_access_flags;
    if (mask & IBV_QP_PATH_MTU) q.path_mtu = a.path_mtu;
    if (mask & IBV_QP_DEST_QPN) q.dest_qpn = a.dest_qp_num;
    if (mask & IBV_QP_AV) q.av = a.ah_attr;
    if (mask & IBV_QP_RQ_PSN) q.rq_psn = a.rq_psn;
    if (mask & IBV_QP_SQ_PSN) q.sq_psn = a.sq_psn;
    if (mask & IBV_QP_TIMEOUT) q.timeout = a.timeout;
    if (mask & IBV_QP_RETRY_CNT) q.retry_cnt = a.retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) q.rnr_retry = a.rnr_retry;
    if (mask & IBV_QP_MIN_RNR_TIMER) q.min_rnr_timer = a.min_rnr_timer;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q.max_rd_atomic = a.max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q.max_dest_rd_atomic = a.max_dest_rd_atomic;
}

}  // namespace

SV_EXPORT ibv::qp *ibv_create_qp(ibv::pd *pd, ibv::qp_init_attr *init) {
    Pd *p = impl_of<Pd>(pd);
    Cq *scq = impl_of<Cq>(init->send_cq);
    Cq *rcq = impl_of<Cq>(init->recv_cq);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    Device *dev = p->ctx->dev;
    const DeviceSpec &s = dev->spec;
    if (init->qp_type != ibv::IBV_QPT_RC) return fail_null<ibv::qp>(EOPNOTSUPP);
    if (!scq || !rcq || init->srq) return fail_null<ibv::qp>(EINVAL);
    if (scq->ctx->dev != dev || rcq->ctx->dev != dev) return fail_null<ibv::qp>(EINVAL);
    const ibv::qp_cap &c = init->cap;
    if (c.max_send_wr > static_cast<uint32_t>(s.max_qp_wr) || c.max_recv_wr > static_cast<uint32_t>(s.max_qp_wr) ||
        c.max_send_sge > static_cast<uint32_t>(s.max_sge) || c.max_recv_sge > static_cast<uint32_t>(s.max_sge) ||
        c.max_inline_data > static_cast<uint32_t>(kMaxInline))
        return fail_null<ibv::qp>(EINVAL);
    if (dev->qps.size() >= static_cast<size_t>(s.max_qp)) return fail_null<ibv::qp>(ENOMEM);
    auto q = std::make_shared<Qp>();
    q->h.impl = q.get();
    q->dev = dev;
    q->ctx = p->ctx;
    q->pd = p;
    q->scq = scq;
    q->rcq = rcq;
    q->num = reg.next_qpn++ & 0xffffff;
    q->cap = c;
    q->sig_all = init->sq_sig_all != 0;
    ibv::qp &abi = q->h.abi;
    abi.context = pd->context;
    abi.qp_context = init->qp_context;
    abi.pd = pd;
    abi.send_cq = init->send_cq;
    abi.recv_cq = init->recv_cq;
    abi.handle = q->num;
    abi.qp_num = q->num;
    abi.state = ibv::IBV_QPS_RESET;
    abi.qp_type = ibv::IBV_QPT_RC;
    pthread_mutex_init(&abi.mutex, nullptr);
    pthread_cond_init(&abi.cond, nullptr);
    ++p->refs;
    ++scq->qps;
    ++rcq->qps;
    dev->qps[q->num] = q;
    return &abi;
}

SV_EXPORT int ibv_modify_qp(ibv::qp *qp, ibv::qp_attr *attr, int mask) {
    Qp *q = impl_of<Qp>(qp);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    int cur = q->state.load();
    if ((mask & ibv::IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
    int next = (mask & ibv::IBV_QP_STATE) ? attr->qp_state : cur;
    Transition t{};
    if (!transition_masks(cur, next, t)) return EINVAL;
    int allowed = t.required | t.optional | ibv::IBV_QP_STATE;
    if ((mask & t.required) != t.required || (mask & ~allowed)) return EINVAL;
    if (!attrs_valid(*q, *attr, mask)) return EINVAL;
    apply(*q, *attr, mask);
    if (next == ibv::IBV_QPS_RESET) {
        // Reset drops every outstanding WR without a completion.
        std::lock_guard<std::mutex> l2(q->post_mu);
        q->epoch.fetch_add(1);
        q->posted = q->freed = 0;
        q->dest_qpn = 0;
        q->av = ibv::ah_attr{};
    }
    q->state.store(next);
    qp->state = static_cast<ibv::qp_state>(next);  // as libibverbs does after a successful modify
    return 0;
}

SV_EXPORT int ibv_query_qp(ibv::qp *qp, ibv::qp_attr *a, int, ibv::qp_init_attr *init) {
    Qp *q = impl_of<Qp>(qp);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    std::memset(a, 0, sizeof(*a));
    a->qp_state = static_cast<ibv::qp_state>(q->state.load());
    a->cur_qp_state = a->qp_state;
    a->path_mtu = static_cast<ibv::mtu>(q->path_mtu);
    a->rq_psn = q->rq_psn;
    a->sq_psn = q->sq_psn;
    a->dest_qp_num = q->dest_qpn;
    a->qp_access_flags = q->access;
    a->cap = q->cap;
    a->ah_attr = q->av;
    a->pkey_index = q->pkey_index;
    a->max_rd_atomic = q->max_rd_atomic;
    a->max_dest_rd_atomic = q->max_dest_rd_atomic;
    a->min_rnr_timer = q->min_rnr_timer;
    a->port_num = q->port;
    a->timeout = q->timeout;
    a->retry_cnt = q->retry_cnt;
    a->rnr_retry = q->rnr_retry;
    if (init) {
        std::memset(init, 0, sizeof(*init));
        init->qp_context = qp->qp_context;
        init->send_cq = qp->send_cq;
        init->recv_cq = qp->recv_cq;
        init->cap = q->cap;
        init->qp_type = ibv::IBV_QPT_RC;
        init->sq_sig_all = q->sig_all ? 1 : 0;
    }
    return 0;
}

SV_EXPORT int ibv_destroy_qp(ibv::qp *qp) {
    Qp *q = impl_of<Qp>(qp);
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    drop_qp(q);
    return 0;
}

namespace sv {

// Pending WRs of a dropped QP vanish; CQEs already queued stay valid.
void drop_qp(Qp *q) {
    std::shared_ptr<Qp> keep = q->shared_from_this();
    q->destroyed = true;
    q->state.store(ibv::IBV_QPS_RESET);
    --q->pd->refs;
    --q->scq->qps;
    --q->rcq->qps;
    q->dev->qps.erase(q->num);
    pthread_mutex_destroy(&q->h.abi.mutex);
    pthread_cond_destroy(&q->h.abi.cond);
}

}  // namespace sv
