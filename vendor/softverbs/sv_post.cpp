// Posting: the checks a provider makes synchronously in ibv_post_send, then
// a copy of each WR goes to the device worker (sv_exec.cpp).
#include <cstring>

#include "sv_state.h"

using namespace sv;

namespace {

int check_wr(const Qp &q, const ibv::send_wr &wr) {
    if (wr.opcode != ibv::IBV_WR_RDMA_WRITE && wr.opcode != ibv::IBV_WR_RDMA_READ) return EINVAL;
    if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > q.cap.max_send_sge) return EINVAL;
    if (wr.num_sge > 0 && !wr.sg_list) return EINVAL;
    if (wr.send_flags & ibv::IBV_SEND_INLINE) {
        if (wr.opcode == ibv::IBV_WR_RDMA_READ) return EINVAL;
        uint64_t total = 0;
        for (int i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
        if (total > q.cap.max_inline_data) return EINVAL;
    }
    return 0;
}

Work make_work(const std::shared_ptr<Qp> &q, const ibv::send_wr &wr) {
    Work w;
    w.qp = q;
    w.wr_id = wr.wr_id;
    w.opcode = wr.opcode;
    w.flags = wr.send_flags;
    w.remote_addr = wr.wr.rdma.remote_addr;
    w.rkey = wr.wr.rdma.rkey;
    if (wr.send_flags & ibv::IBV_SEND_INLINE) {
        // Inline data is copied now: the caller may reuse its buffer at once.
        w.is_inline = true;
        for (int i = 0; i < wr.num_sge; ++i) {
            const char *src = reinterpret_cast<const char *>(static_cast<uintptr_t>(wr.sg_list[i].addr));
            w.inline_data.insert(w.inline_data.end(), src, src + wr.sg_list[i].length);
        }
    } else {
        w.sges.assign(wr.sg_list, wr.sg_list + wr.num_sge);
    }
    return w;
}

}  // namespace

int sv::op_post_send(ibv::qp *qp, ibv::send_wr *wr, ibv::send_wr **bad_wr) {
    Qp *q = impl_of<Qp>(qp);
    std::shared_ptr<Qp> self = q->shared_from_this();
    Device *dev = q->dev;
    std::lock_guard<std::mutex> lock(q->post_mu);
    std::vector<Work> batch;
    int rc = 0;
    for (ibv::send_wr *cur = wr; cur; cur = cur->next) {
        int st = q->state.load();
        // A QP takes send WRs only from RTS on; in ERR they are flushed.
        if (st == ibv::IBV_QPS_RESET || st == ibv::IBV_QPS_INIT || st == ibv::IBV_QPS_RTR) rc = EINVAL;
        if (!rc) rc = check_wr(*q, *cur);
        if (!rc && q->posted - q->freed >= q->cap.max_send_wr) rc = ENOMEM;  // send queue full
        if (rc) {
            if (bad_wr) *bad_wr = cur;
            break;
        }
        Work w = make_work(self, *cur);
        w.seq = q->posted++;
        w.epoch = q->epoch.load();
        batch.push_back(std::move(w));
    }
    if (!batch.empty()) {
        {
            std::lock_guard<std::mutex> l2(dev->qmu);
            for (Work &w : batch) dev->queue.push_back(std::move(w));
        }
        dev->qcv.notify_one();
    }
    return rc;
}

// Receive queues are not emulated: the RDMA transport is one-sided.
int sv::op_post_recv(ibv::qp *, ibv::recv_wr *wr, ibv::recv_wr **bad_wr) {
    if (bad_wr) *bad_wr = wr;
    return EOPNOTSUPP;
}
