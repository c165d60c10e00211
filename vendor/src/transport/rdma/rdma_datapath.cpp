// RdmaTransport's data path: the per-peer route (usable local NICs of the
// agreed link layer, the peer's NIC plans), submit() checking each item's
// ranges and cutting it into slices striped over the NICs, and posting a
// slice as one signalled READ/WRITE work request with back-pressure.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/text.h"
#include "common/range.h"
#include "transport/rdma/nic_choice.h"
#include "transport/rdma/nic_filter.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_transport_internal.h"

namespace mcrs::rdma {

namespace {

// "0x1f", for error messages.
}  // namespace

std::shared_ptr<RdmaTransport::PeerRoute> RdmaTransport::route_for(
    const std::shared_ptr<const SegmentDesc> &peer) {
    uint64_t epoch = usable_epoch_.load();
    {
        std::lock_guard<std::mutex> g(routes_mu_);
        auto it = routes_.find(peer->name);
        if (it != routes_.end() && it->second->epoch == epoch && it->second->desc.lock() == peer)
            return it->second;
    }
    auto r = std::make_shared<PeerRoute>();
    r->desc = peer;
    r->epoch = epoch;
    std::vector<NicLink> local;
    std::vector<size_t> local_idx;
    for (size_t i = 0; i < ctxs_.size(); ++i)
        if (ctxs_[i]->usable.load()) {
            local.push_back(NicLink{ctxs_[i]->name, ctxs_[i]->link_layer});
            local_idx.push_back(i);
        }
    LinkPlan plan;
    try {
        if (local.empty()) throw Error(kErrDeviceNotFound, "no local RDMA NIC is usable (all ports down)");
        plan = plan_link_layer(local, peer_links_from_descriptor(peer->devices), peer->name);
        if (plan.local.empty() || plan.peer.empty())
            throw Error(kErrDeviceNotFound, "no common RDMA link layer with segment '" + peer->name + "'");
    } catch (const Error &e) {
        r->error = e.what();
    }
    for (size_t k : plan.local) r->lnics.push_back(local_idx[k]);
    std::sort(r->lnics.begin(), r->lnics.end());
    r->peer_nics = plan.peer;
    std::vector<std::string> names;
    for (const auto &d : peer->devices) names.push_back(d.name);
    try {
        r->topo = PeerTopology::from_descriptor(peer->priority_matrix, names);
    } catch (const Error &e) {
        // The matrix only steers the choice: without it every NIC is preferred.
        MC_LOG(Warn, "segment '" << peer->name << "': " << e.what() << "; its NIC preferences are ignored");
        r->topo = PeerTopology::from_descriptor(Json(), names);
    }
    for (const auto &n : names) r->peer_paths.push_back(make_nic_path(peer->name, n));
    for (size_t nic = 0; nic < ctxs_.size(); ++nic)
        for (const auto &pp : r->peer_paths) r->ep_keys.push_back(std::to_string(nic) + "|" + pp);
    std::lock_guard<std::mutex> g(routes_mu_);
    routes_[peer->name] = r;
    return r;
}


std::string RdmaTransport::check_item(const TransferItem &item, const SegmentDesc &peer, std::string &location,
                                      size_t &peer_buf) const {
    uint64_t laddr = reinterpret_cast<uint64_t>(item.local);
    // Local range inside one of our registrations?
    bool local_ok = false;
    {
        std::lock_guard<std::mutex> g(reg_mu_);
        auto r = regs_.upper_bound(laddr);
        if (r != regs_.begin()) {
            --r;
            local_ok = range_within(laddr, item.length, r->first, r->second.len);
            location = r->second.location;
        }
    }
    if (!local_ok)
        return "local range " + hex(laddr) + "+" + std::to_string(item.length) +
               " is not registered with the RDMA transport";
    // Remote range inside one of the peer's published buffers with rkeys?
    size_t pb = peer.buffers.size();
    for (size_t b = 0; b < peer.buffers.size(); ++b) {
        const BufferDesc &bd = peer.buffers[b];
        if (range_within(item.remote_addr, item.length, bd.addr, bd.length)) {
            pb = b;
            break;
        }
    }
    if (pb == peer.buffers.size())
        return "remote range " + hex(item.remote_addr) + "+" + std::to_string(item.length) +
               " is not inside a buffer published by segment '" + peer.name + "'";
    if (peer.buffers[pb].rkey.size() < peer.devices.size())
        return "the buffer at " + hex(peer.buffers[pb].addr) + " of segment '" + peer.name +
               "' is not remote-accessible over RDMA (no rkey per device)";
    peer_buf = pb;
    return "";
}

void RdmaTransport::submit(const std::shared_ptr<const SegmentDesc> &peer,
                           std::vector<TransferItem> &items) {
    std::shared_ptr<PeerRoute> route = route_for(peer);
    const std::string &plan_error = route->error;
    std::vector<Slice *> todo;
    for (auto &it : items) {
        if (!plan_error.empty()) {
            it.fail(plan_error);
            continue;
        }
        std::string location;
        size_t pb = 0;
        std::string bad = check_item(it, *peer, location, pb);
        if (!bad.empty()) {
            it.fail(bad);
            continue;
        }
        uint64_t laddr = reinterpret_cast<uint64_t>(it.local);
        // The local NICs of the buffer's location and the peer NICs of the
        // target buffer's location, the rest as fallback
        // (docs/wire-protocol.md, RDMA priority matrix).
        auto lp = route->local_plan(topo_, location);
        auto pp = route->peer_plan(peer->buffers[pb].name);
        auto st = std::make_shared<detail::ItemState>();
        uint64_t ss = cfg_.slice_size ? cfg_.slice_size : 65536;
        size_t nslices = static_cast<size_t>((it.length + ss - 1) / ss);
        st->remaining.store(nslices);
        st->item = std::move(it);
        for (size_t k = 0; k < nslices; ++k) {
            auto *s = new Slice;
            s->item = st;
            s->peer = peer;
            s->route = route;
            s->opcode = st->item.opcode;
            uint64_t off = k * ss;
            s->local = laddr + off;
            s->remote = st->item.remote_addr + off;
            s->len = std::min<uint64_t>(ss, st->item.length - off);
            s->peer_buf = pb;
            s->plan = lp;
            s->peer_plan = pp;
            s->local_pos = (k + next_rr_) % lp->stripe.size();
            s->peer_pos = (k + next_rr_) % pp->stripe.size();
            s->deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(opt_.transfer_timeout_ms);
            todo.push_back(s);
        }
        next_rr_ += nslices;
    }
    for (auto *s : todo) post_slice(s, false);
}

void RdmaTransport::post_slice(Slice *s, bool from_poller) {
    for (;;) {
        if (closing_.load()) {
            finish_slice(s, false, "the RDMA transport is shutting down");
            return;
        }
        // A usable local NIC of the stripe set (else a fallback) on a rail
        // that is not paused.
        RailPick pk = pick_rail(
            *s->plan, s->local_pos, *s->peer_plan, s->peer_pos,
            [this](size_t nic) { return ctxs_[nic]->usable.load(); },
            [this, s](size_t nic, size_t pidx) { return rail_paused(nic, *s->route, pidx); },
            s->avoid_local);
        if (!pk.found) {
            finish_slice(s, false, "no local RDMA NIC is usable for this transfer (ports down)");
            return;
        }
        s->local_pos = pk.local_pos;
        s->peer_pos = pk.peer_pos;
        size_t nic = s->nic();
        std::string err;
        bool full = false;
        try {
            auto ep = get_endpoint(nic, *s->route, s->peer_idx());
            uint32_t lkey = 0;
            if (!find_lkey(s->local, s->len, nic, lkey)) {
                err = "local memory was unregistered";
            } else {
                PostOutcome o = post_on_endpoint(s, ep, lkey, err);
                if (o == PostOutcome::Posted) return;  // `s` is the poller's now
                full = o == PostOutcome::QueueFull;
            }
        } catch (const Error &e) {
            err = e.what();
        }
        if (full) {
            if (wait_for_slot(s, nic, from_poller)) continue;
            return;
        }
        retry_slice(s, err, /*blame=*/true, /*avoid_local=*/false, from_poller);
        return;
    }
}

RdmaTransport::PostOutcome RdmaTransport::post_on_endpoint(Slice *s, const std::shared_ptr<Endpoint> &ep,
                                                           uint32_t lkey, std::string &err) {
    RdmaContext &c = *ctxs_[ep->nic];
    ibv::sge sg{s->local, static_cast<uint32_t>(s->len), lkey};
    ibv::send_wr wr{};
    wr.wr_id = reinterpret_cast<uint64_t>(s);
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.opcode = s->opcode == 0 ? ibv::IBV_WR_RDMA_READ : ibv::IBV_WR_RDMA_WRITE;
    wr.send_flags = ibv::IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = s->remote;
    wr.wr.rdma.rkey = s->peer->buffers[s->peer_buf].rkey[s->peer_idx()];
    ibv::send_wr *bad = nullptr;
    std::lock_guard<std::mutex> pg(ep->post_mu);
    size_t nq = ep->qps.size();
    size_t qi = nq;
    for (size_t t = 0; t < nq; ++t) {
        size_t cand = ep->rr.fetch_add(1) % nq;
        if (ep->qp_outstanding[cand].load() < cfg_.max_wr) {
            qi = cand;
            break;
        }
    }
    if (qi == nq || c.outstanding.load() >= cfg_.max_cqe_per_ctx) return PostOutcome::QueueFull;
    s->ep = ep;
    s->qp_index = qi;
    s->posted_at = std::chrono::steady_clock::now();
    ep->qp_outstanding[qi].fetch_add(1);
    c.outstanding.fetch_add(1);
    c.inflight_bytes.fetch_add(s->len);
    inflight_.fetch_add(1);
    {
        // Before posting: the completion may beat us back.
        std::lock_guard<std::mutex> g(posted_mu_);
        posted_.insert(s);
    }
    int rc = ibv::post_send(ep->qps[qi], &wr, &bad);
    if (rc == 0) {
        c.wrs.fetch_add(1);
        return PostOutcome::Posted;
    }
    {
        std::lock_guard<std::mutex> g(posted_mu_);
        posted_.erase(s);
    }
    inflight_.fetch_sub(1);
    c.outstanding.fetch_sub(1);
    c.inflight_bytes.fetch_sub(s->len);
    ep->qp_outstanding[qi].fetch_sub(1);
    s->ep.reset();
    if (rc == ENOMEM) return PostOutcome::QueueFull;
    err = "ibv_post_send on " + c.name + " failed: " + std::strerror(rc);
    drop_endpoint(ep);
    return PostOutcome::Failed;
}

bool RdmaTransport::wait_for_slot(Slice *s, size_t nic, bool from_poller) {
    // Back-pressure: the send queues / CQ of this NIC are full.
    if (std::chrono::steady_clock::now() > s->deadline) {
        finish_slice(s, false, "timed out waiting for a free send-queue slot on NIC " + ctxs_[nic]->name);
        return false;
    }
    if (from_poller) {
        std::lock_guard<std::mutex> g(pending_mu_);
        pending_.push_back(s);
        return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    return true;
}

}  // namespace mcrs::rdma
