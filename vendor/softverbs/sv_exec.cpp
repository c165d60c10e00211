// The per-device worker: executes posted RDMA READ/WRITE WRs in post order
// by copying between registered regions, after the checks the requester
// and the responder HCA make, and completes them with the status hardware
// would report. Errors move the QP to ERR; later WRs are flushed.
#include <cstring>

#include "sv_state.h"

namespace sv {

namespace {

using namespace ibv;

constexpr uint64_t kMaxMsg = 0x80000000ull;

// The device a QP's address vector reaches (GID when global, else LID).
Device *route(const Qp &q) {
    for (auto &d : registry().devices) {
        if (q.av.is_global) {
            for (const GidEntry &g : d->gids)
                if (std::memcmp(g.gid.raw, q.av.grh.dgid.raw, 16) == 0) return d.get();
        } else if (!d->spec.roce && d->lid == q.av.dlid) {
            return d.get();
        }
    }
    return nullptr;
}

bool in_bounds(const Mr &m, uint64_t addr, uint64_t len) {
    return addr >= m.iova && len <= m.length && addr - m.iova <= m.length - len;
}

char *host_of(const Mr &m, uint64_t addr) { return m.host + (addr - m.iova); }

struct Local {
    char *host;
    uint64_t len;
};

// Requester-side checks and the copy; returns the completion status.
int run(Device *dev, Qp &q, const Work &w, uint64_t &len) {
    Registry &reg = registry();
    if (q.state.load() == IBV_QPS_ERR) return IBV_WC_WR_FLUSH_ERR;
    Device *peer = route(q);
    for (size_t i = 0; i < reg.injections.size(); ++i) {
        Injection &inj = reg.injections[i];
        if (inj.dev != dev || (inj.peer && inj.peer != peer)) continue;
        int st = inj.status;
        if (--inj.remaining <= 0) reg.injections.erase(reg.injections.begin() + static_cast<long>(i));
        return st;
    }
    // No usable path or no responder: the requester retries, then gives up.
    if (dev->port_state != IBV_PORT_ACTIVE || !peer || peer->port_state != IBV_PORT_ACTIVE ||
        peer->spec.roce != dev->spec.roce)
        return IBV_WC_RETRY_EXC_ERR;
    auto it = peer->qps.find(q.dest_qpn);
    if (it == peer->qps.end()) return IBV_WC_RETRY_EXC_ERR;
    Qp &r = *it->second;
    int rs = r.state.load();
    if ((rs != IBV_QPS_RTR && rs != IBV_QPS_RTS) || r.dest_qpn != q.num || route(r) != dev)
        return IBV_WC_RETRY_EXC_ERR;

    const bool read = w.opcode == IBV_WR_RDMA_READ;
    std::vector<Local> local;
    len = 0;
    if (w.is_inline) {
        len = w.inline_data.size();
    } else {
        for (const sge &s : w.sges) {
            len += s.length;
            if (s.length == 0) continue;
            auto m = dev->by_lkey.find(s.lkey);
            if (m == dev->by_lkey.end() || m->second->pd != q.pd || !in_bounds(*m->second, s.addr, s.length) ||
                (read && !(m->second->access & IBV_ACCESS_LOCAL_WRITE)))
                return IBV_WC_LOC_PROT_ERR;
            local.push_back({host_of(*m->second, s.addr), s.length});
        }
    }
    if (len > kMaxMsg) return IBV_WC_LOC_LEN_ERR;
    if (len == 0) return IBV_WC_SUCCESS;  // zero-length RDMA checks no rkey

    const int need = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    auto rm = peer->by_rkey.find(w.rkey);
    if (rm == peer->by_rkey.end() || rm->second->pd != r.pd || !in_bounds(*rm->second, w.remote_addr, len) ||
        !(rm->second->access & need) || !(r.access & static_cast<unsigned int>(need))) {
        // The responder NAKs and its QP fails too (affiliated access error).
        set_qp_error(&r);
        async_event ev{};
        ev.element.qp = &r.h.abi;
        ev.event_type = IBV_EVENT_QP_ACCESS_ERR;
        push_async_event(r.ctx, ev);
        return IBV_WC_REM_ACCESS_ERR;
    }
    char *remote = host_of(*rm->second, w.remote_addr);
    if (w.is_inline) {
        std::memmove(remote, w.inline_data.data(), len);
    } else {
        for (const Local &l : local) {
            if (read) std::memmove(l.host, remote, l.len);
            else std::memmove(remote, l.host, l.len);
            remote += l.len;
        }
    }
    dev->counters.bytes_moved += len;
    ++(read ? dev->counters.reads : dev->counters.writes);
    ++peer->counters.served_wrs;
    peer->counters.served_bytes += len;
    return IBV_WC_SUCCESS;
}

void execute(Device *dev, const Work &w) {
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    Qp &q = *w.qp;
    if (q.destroyed || w.epoch != q.epoch.load()) return;  // destroyed or reset meanwhile
    uint64_t len = 0;
    int status = run(dev, q, w, len);
    ++dev->counters.wrs_executed;
    if (status != IBV_WC_SUCCESS) {
        ++dev->counters.wrs_failed;
        set_qp_error(&q);
    }
    // A lost completion (test fault): the data moved, no CQE ever comes.
    if (status == IBV_WC_SUCCESS && dev->drop_completions > 0) {
        --dev->drop_completions;
        return;
    }
    // Errors (flushes included) always complete; successes only if signaled.
    if (status == IBV_WC_SUCCESS && !q.sig_all && !(w.flags & IBV_SEND_SIGNALED)) return;
    Cqe e;
    std::memset(&e.wc, 0, sizeof(e.wc));
    e.wc.wr_id = w.wr_id;
    e.wc.status = static_cast<wc_status>(status);
    e.wc.opcode = w.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
    e.wc.byte_len = status == IBV_WC_SUCCESS ? static_cast<uint32_t>(len) : 0;
    e.wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x100u + static_cast<uint32_t>(status);
    e.wc.qp_num = q.num;
    e.qp = w.qp;
    e.seq = w.seq;
    e.epoch = w.epoch;
    if (!push_completion(q.scq, e)) set_qp_error(&q);
}

}  // namespace

void worker_loop(Device *dev) {
    for (;;) {
        Work w;
        {
            std::unique_lock<std::mutex> lock(dev->qmu);
            dev->qcv.wait(lock, [dev] { return dev->stop || (!dev->paused && !dev->queue.empty()); });
            if (dev->stop) return;
            w = std::move(dev->queue.front());
            dev->queue.pop_front();
            dev->busy = true;
        }
        execute(dev, w);
        w.qp.reset();  // drop our reference before saying we are idle
        std::lock_guard<std::mutex> lock(dev->qmu);
        dev->busy = false;
    }
}

}  // namespace sv
