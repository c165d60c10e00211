// RdmaTransport's completions: the poller thread (CQ polling, parked
// slices, the slice-timeout sweep), what a completion or a timeout does
// to its slice (finish, or retry on another rail), and the bookkeeping of
// paused rails (a local NIC to a peer NIC) that steers the retries.
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/rdma/rail_monitor.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_transport_internal.h"

namespace mcrs::rdma {

namespace {

// One successful WR of `len` bytes posted at `posted_at`: folds its rate
// into the NIC's EWMA (weight 1/8 for the new sample; the first sample is
// taken as it is). Only the poller thread writes the EWMA.
void note_rate(RdmaContext &c, uint64_t len, std::chrono::steady_clock::time_point posted_at) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - posted_at).count();
    if (secs <= 0.0) secs = 1e-9;
    double sample = static_cast<double>(len) / secs;
    double old = c.ewma_bps.load(std::memory_order_relaxed);
    c.ewma_bps.store(old == 0.0 ? sample : old * 0.875 + sample * 0.125, std::memory_order_relaxed);
}

}  // namespace

std::string RdmaTransport::rail_key(size_t nic, const std::string &peer_path) const {
    return ctxs_[nic]->name + "|" + peer_path;
}

std::string RdmaTransport::peer_path_of(const Slice &s) const { return s.route->peer_paths[s.peer_idx()]; }

bool RdmaTransport::rail_paused(size_t nic, const PeerRoute &route, size_t peer_idx) const {
    return rails_.any_paused() && rails_.is_paused(rail_key(nic, route.peer_paths[peer_idx]));
}

bool RdmaTransport::rail_paused(const std::string &local_nic, const std::string &peer_nic_path) const {
    return rails_.is_paused(local_nic + "|" + peer_nic_path);
}

uint32_t RdmaTransport::slice_timeout_ms() const {
    if (opt_.slice_timeout_ms) return opt_.slice_timeout_ms;
    if (cfg_.slice_timeout_s > 0) return static_cast<uint32_t>(cfg_.slice_timeout_s) * 1000u;
    return opt_.transfer_timeout_ms;
}

void RdmaTransport::retry_slice(Slice *s, const std::string &why, bool blame, bool avoid_local,
                                bool from_poller) {
    size_t nic = s->nic();
    RdmaContext &c = *ctxs_[nic];
    c.errors.fetch_add(1);
    if (blame) {
        // Pause at once when another rail can carry the slice, else after
        // RailPolicy::error_threshold errors in the window
        // (docs/wire-protocol.md, RDMA slicing and failure handling).
        bool alt = false;
        size_t nl = plan_size(*s->plan), np = plan_size(*s->peer_plan);
        size_t cur_peer = s->peer_idx();
        for (size_t lp = 0; lp < nl && !alt; ++lp) {
            size_t l = local_at(*s->plan, lp);
            if (!ctxs_[l]->usable.load()) continue;
            for (size_t pp = 0; pp < np && !alt; ++pp) {
                size_t pidx = nic_at(*s->peer_plan, pp);
                if (l == nic && pidx == cur_peer) continue;
                alt = !rail_paused(l, *s->route, pidx);
            }
        }
        std::string rail = rail_key(nic, peer_path_of(*s));
        if (rails_.record_error(rail, alt))
            MC_LOG(Warn, "RDMA rail " << rail << " paused for " << rails_.policy().pause_ms << " ms after errors");
    }
    int next = s->retries + 1;
    if (closing_.load() || next >= cfg_.retry_cnt) {
        finish_slice(s, false, why + " (after " + std::to_string(next) + " attempt(s), MC_RETRY_CNT " +
                                   std::to_string(cfg_.retry_cnt) + ")");
        return;
    }
    MC_LOG(Warn, why << "; retrying on another rail");
    s->retries = next;
    c.retries.fetch_add(1);
    s->avoid_local = avoid_local ? static_cast<long>(nic) : -1;
    ++s->local_pos;
    ++s->peer_pos;
    post_slice(s, from_poller);
}

void RdmaTransport::finish_slice(Slice *s, bool ok, const std::string &why) {
    auto st = s->item;
    delete s;
    if (!ok) {
        std::lock_guard<std::mutex> g(st->mu);
        if (st->why.empty()) st->why = why;
    }
    if (st->remaining.fetch_sub(1) == 1) {
        std::string w;
        {
            std::lock_guard<std::mutex> g(st->mu);
            w = st->why;
        }
        if (w.empty())
            st->item.complete();
        else
            st->item.fail(w);
    }
}

void RdmaTransport::expire_slices() {
    auto now = std::chrono::steady_clock::now();
    uint32_t limit = slice_timeout_ms();
    auto lim = std::chrono::milliseconds(limit);
    std::vector<Slice *> late;
    {
        std::lock_guard<std::mutex> g(posted_mu_);
        for (auto *s : posted_)
            if (now - s->posted_at > lim) late.push_back(s);
        for (auto *s : late) {
            posted_.erase(s);
            zombies_.insert(s);
        }
    }
    const char *knob = opt_.slice_timeout_ms ? "slice timeout"
                       : cfg_.slice_timeout_s > 0 ? "MC_SLICE_TIMEOUT" : "transfer timeout";
    for (auto *z : late) {
        // The WR may still complete (stalled) or never (lost): the original
        // stays a zombie until then; a copy carries the retry.
        RdmaContext &c = *ctxs_[z->nic()];
        inflight_.fetch_sub(1);
        c.outstanding.fetch_sub(1);
        c.inflight_bytes.fetch_sub(z->len);
        if (z->ep) {
            z->ep->qp_outstanding[z->qp_index].fetch_sub(1);
            drop_endpoint(z->ep);
        }
        auto *s = new Slice(*z);
        s->ep.reset();
        z->item.reset();
        z->peer.reset();
        z->route.reset();
        z->ep.reset();
        std::string why = "RDMA " + std::string(s->opcode == 0 ? "READ" : "WRITE") + " of " +
                          std::to_string(s->len) + " bytes on NIC " + c.name + " to " + peer_path_of(*s) +
                          " got no completion within " + std::to_string(limit) + " ms (" + knob + ")";
        MC_LOG(Warn, why);
        retry_slice(s, why, /*blame=*/true, /*avoid_local=*/false, /*from_poller=*/true);
    }
}

void RdmaTransport::poller_loop() {
    ibv::wc wcs[32];
    auto next_sweep = std::chrono::steady_clock::now();
    while (!stop_.load()) {
        int got = 0;
        for (size_t i = 0; i < ctxs_.size(); ++i) {
            RdmaContext &c = *ctxs_[i];
            int n = ibv::poll_cq(c.cq, 32, wcs);
            if (n < 0) {
                MC_LOG(Error, "ibv_poll_cq on " << c.name << " failed");
                continue;
            }
            got += n;
            for (int k = 0; k < n; ++k) {
                auto *s = reinterpret_cast<Slice *>(wcs[k].wr_id);
                {
                    std::lock_guard<std::mutex> g(posted_mu_);
                    if (zombies_.erase(s)) {
                        delete s;  // timed out earlier; a copy was retried
                        continue;
                    }
                    posted_.erase(s);
                }
                inflight_.fetch_sub(1);
                c.outstanding.fetch_sub(1);
                c.inflight_bytes.fetch_sub(s->len);
                if (s->ep) s->ep->qp_outstanding[s->qp_index].fetch_sub(1);
                int status = wcs[k].status;
                if (status == ibv::IBV_WC_SUCCESS) {
                    c.bytes.fetch_add(s->len);
                    note_rate(c, s->len, s->posted_at);
                    s->ep.reset();
                    finish_slice(s, true, "");
                    continue;
                }
                // A failed WR leaves its QP in ERR: this endpoint (only) is
                // replaced. The peer rail is blamed only for remote faults.
                CompletionDecision d = decide_completion(status, s->retries, cfg_.retry_cnt);
                if (s->ep) drop_endpoint(s->ep);
                s->ep.reset();
                std::string why = "RDMA " + std::string(s->opcode == 0 ? "READ" : "WRITE") + " of " +
                                  std::to_string(s->len) + " bytes on NIC " + c.name + " to " +
                                  peer_path_of(*s) + " failed: " + ibv::wc_status_name(status);
                retry_slice(s, why, d.blame_peer_rail, d.change_local_nic, /*from_poller=*/true);
            }
        }
        std::vector<Slice *> parked;
        {
            std::lock_guard<std::mutex> g(pending_mu_);
            parked.swap(pending_);
        }
        for (auto *s : parked) post_slice(s, true);
        got += static_cast<int>(parked.size());
        auto now = std::chrono::steady_clock::now();
        if (now >= next_sweep) {
            next_sweep = now + std::chrono::milliseconds(10);
            expire_slices();
        }
        if (got == 0)
            std::this_thread::sleep_for(std::chrono::microseconds(inflight_.load() > 0 ? 20 : 200));
    }
}

}  // namespace mcrs::rdma
