// RdmaTransport's endpoints: RC QPs per (local NIC, peer NIC), brought to
// RTS through the type-0 handshake (active side, with the ready ACK) or
// by answering one (passive side), torn down on errors, late ACKs and
// async events (port down, GID change, QP errors).
#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "transport/rdma/gid.h"
#include "transport/rdma/handshake_desc.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_transport_internal.h"

namespace mcrs::rdma {

using detail::to_ibv_gid;

namespace {

constexpr int kQpAccess = ibv::IBV_ACCESS_LOCAL_WRITE | ibv::IBV_ACCESS_REMOTE_READ |
                          ibv::IBV_ACCESS_REMOTE_WRITE | ibv::IBV_ACCESS_REMOTE_ATOMIC;

int mtu_enum(int bytes) {
    switch (bytes) {
        case 512: return ibv::IBV_MTU_512;
        case 1024: return ibv::IBV_MTU_1024;
        case 2048: return ibv::IBV_MTU_2048;
        default: return ibv::IBV_MTU_4096;
    }
}


}  // namespace

std::shared_ptr<RdmaTransport::Endpoint> RdmaTransport::create_qps(size_t nic) {
    const auto &api = lib_->api();
    RdmaContext &c = *ctxs_[nic];
    auto ep = std::make_shared<Endpoint>();
    ep->nic = nic;
    ep->qp_outstanding.reset(new std::atomic<int>[static_cast<size_t>(cfg_.num_qp_per_ep)]);
    for (int i = 0; i < cfg_.num_qp_per_ep; ++i) ep->qp_outstanding[i].store(0);
    for (int i = 0; i < cfg_.num_qp_per_ep; ++i) {
        ibv::qp_init_attr init{};
        init.send_cq = c.cq;
        init.recv_cq = c.cq;
        init.cap.max_send_wr = static_cast<uint32_t>(cfg_.max_wr);
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = static_cast<uint32_t>(cfg_.max_sge);
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = static_cast<uint32_t>(cfg_.max_inline);
        init.qp_type = ibv::IBV_QPT_RC;
        init.sq_sig_all = 0;
        ibv::qp *q = api.create_qp(c.pd, &init);
        if (!q) {
            int err = errno;
            for (auto *x : ep->qps) api.destroy_qp(x);
            throw Error(kErrEndpoint, "ibv_create_qp on " + c.name + " failed: " + std::strerror(err));
        }
        ep->qps.push_back(q);
        ibv::qp_attr a{};
        a.qp_state = ibv::IBV_QPS_INIT;
        a.port_num = static_cast<uint8_t>(cfg_.ib_port);
        a.pkey_index = static_cast<uint16_t>(cfg_.pkey_index);
        a.qp_access_flags = kQpAccess;
        int rc = api.modify_qp(q, &a, ibv::IBV_QP_STATE | ibv::IBV_QP_PKEY_INDEX | ibv::IBV_QP_PORT |
                                          ibv::IBV_QP_ACCESS_FLAGS);
        if (rc != 0) {
            for (auto *x : ep->qps) api.destroy_qp(x);
            throw Error(kErrEndpoint, "QP to INIT on " + c.name + " failed: " + std::strerror(rc));
        }
    }
    return ep;
}

void RdmaTransport::connect_qps(Endpoint &ep, const std::vector<uint32_t> &peer_qpn,
                                const ibv::gid &peer_gid, uint32_t peer_lid) {
    const auto &api = lib_->api();
    RdmaContext &c = *ctxs_[ep.nic];
    PortAddress pa = c.address();
    for (size_t i = 0; i < ep.qps.size(); ++i) {
        ibv::qp_attr a{};
        a.qp_state = ibv::IBV_QPS_RTR;
        int mtu = mtu_enum(cfg_.mtu);
        a.path_mtu = static_cast<ibv::mtu>(pa.active_mtu < mtu ? pa.active_mtu : mtu);
        a.dest_qp_num = peer_qpn[i];
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = peer_gid;
        a.ah_attr.grh.sgid_index = static_cast<uint8_t>(pa.gid_index);
        a.ah_attr.grh.hop_limit = 16;
        if (cfg_.ib_tc >= 0) a.ah_attr.grh.traffic_class = static_cast<uint8_t>(cfg_.ib_tc);
        a.ah_attr.dlid = static_cast<uint16_t>(peer_lid);
        a.ah_attr.sl = static_cast<uint8_t>(cfg_.sl());
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.static_rate = 0;
        a.ah_attr.port_num = static_cast<uint8_t>(cfg_.ib_port);
        int rc = api.modify_qp(ep.qps[i], &a,
                               ibv::IBV_QP_STATE | ibv::IBV_QP_AV | ibv::IBV_QP_PATH_MTU |
                                   ibv::IBV_QP_DEST_QPN | ibv::IBV_QP_RQ_PSN |
                                   ibv::IBV_QP_MAX_DEST_RD_ATOMIC | ibv::IBV_QP_MIN_RNR_TIMER);
        if (rc != 0)
            throw Error(kErrEndpoint, "QP to RTR on " + c.name + " failed: " + std::strerror(rc));
        ibv::qp_attr b{};
        b.qp_state = ibv::IBV_QPS_RTS;
        b.timeout = 14;
        b.retry_cnt = 7;
        b.rnr_retry = 7;
        b.sq_psn = 0;
        b.max_rd_atomic = 16;
        rc = api.modify_qp(ep.qps[i], &b,
                           ibv::IBV_QP_STATE | ibv::IBV_QP_TIMEOUT | ibv::IBV_QP_RETRY_CNT |
                               ibv::IBV_QP_RNR_RETRY | ibv::IBV_QP_SQ_PSN | ibv::IBV_QP_MAX_QP_RD_ATOMIC);
        if (rc != 0)
            throw Error(kErrEndpoint, "QP to RTS on " + c.name + " failed: " + std::strerror(rc));
    }
    ep.peer_qpn = peer_qpn;
}

void RdmaTransport::drop_endpoint(const std::shared_ptr<Endpoint> &ep) {
    // Called with ep_mu_ held or not; QPs go to ERR (flushing their WRs)
    // and are destroyed only at teardown, so late completions stay valid.
    if (ep->broken.exchange(true)) return;
    for (auto *q : ep->qps) {
        ibv::qp_attr a{};
        a.qp_state = ibv::IBV_QPS_ERR;
        lib_->api().modify_qp(q, &a, ibv::IBV_QP_STATE);
    }
}

std::shared_ptr<RdmaTransport::Endpoint> RdmaTransport::get_endpoint(size_t nic, const PeerRoute &route,
                                                                     size_t peer_idx) {
    const std::string &key = route.ep_key(nic, peer_idx);
    {
        // The common case: connected already; no handshake lock, no strings built.
        std::lock_guard<std::mutex> g(ep_mu_);
        auto it = active_.find(key);
        if (it != active_.end() && !it->second->broken.load()) return it->second;
    }
    auto peer_sp = route.desc.lock();
    if (!peer_sp) throw Error(kErrEndpoint, "the peer descriptor went away");
    std::string own_path = make_nic_path(opt_.server_name, ctxs_[nic]->name);
    std::lock_guard<std::mutex> cg(connect_mu_);
    {
        std::lock_guard<std::mutex> g(ep_mu_);
        auto it = active_.find(key);
        if (it != active_.end()) {
            if (!it->second->broken.load()) return it->second;
            graveyard_.push_back(it->second);
            active_.erase(it);
        }
    }
    auto ep = create_qps(nic);
    ep->key = key;
    ep->peer_path = route.peer_paths[peer_idx];
    try {
        handshake_active(*ep, *peer_sp, peer_sp->devices[peer_idx], own_path);
    } catch (...) {
        for (auto *q : ep->qps) lib_->api().destroy_qp(q);
        ep->qps.clear();
        throw;
    }
    ep->state = EndpointState::Connected;
    std::lock_guard<std::mutex> g(ep_mu_);
    active_[key] = ep;
    return ep;
}

void RdmaTransport::handshake_active(Endpoint &ep, const SegmentDesc &peer, const DeviceDesc &peer_dev,
                                     const std::string &own_path) {
    const std::string &peer_path = ep.peer_path;
    std::vector<uint32_t> qpn;
    for (auto *q : ep.qps) qpn.push_back(q->qp_num);
    PortAddress own = ctxs_[ep.nic]->address();
    if (peer_path == own_path) {
        connect_qps(ep, qpn, own.gid, own.lid);  // loopback: no handshake
        return;
    }
    HandShakeDesc req = make_request(own_path, peer_path, own.lid, own.gid_text, qpn);
    req.ready_ack = false;
    HandShakeDesc rep;
    try {
        rep = decode_handshake(opt_.send_handshake(peer.name, encode_handshake(req), 0));
    } catch (const Error &e) {
        throw Error(kErrRejectHandshake, std::string("handshake with ") + peer_path + " failed: " + e.what());
    }
    ActiveCheck chk = check_active_reply(rep, own_path, peer_path, ep.qps.size());
    if (!chk.ok) throw Error(kErrRejectHandshake, chk.error);
    std::string gid_text = rep.local_gid;
    if (gid_text.empty()) gid_text = peer_dev.gid;
    auto g = parse_gid(gid_text);
    if (!g) throw Error(kErrRejectHandshake, "handshake with " + peer_path + ": no usable peer GID");
    connect_qps(ep, rep.qp_num, to_ibv_gid(*g), rep.local_lid);
    if (!chk.send_ready_ack) return;
    HandShakeDesc ack = make_ack(req);
    HandShakeDesc ar;
    try {
        ar = decode_handshake(
            opt_.send_handshake(peer.name, encode_handshake(ack), opt_.ready_ack_timeout_ms));
    } catch (const Error &e) {
        throw Error(kErrRejectHandshake, std::string("ready ACK to ") + peer_path + " failed (limit " +
                                             std::to_string(opt_.ready_ack_timeout_ms) + " ms): " + e.what());
    }
    ActiveCheck ac = check_ack_reply(ar);
    if (!ac.ok) throw Error(kErrRejectHandshake, "handshake with " + peer_path + ": " + ac.error);
}

Json RdmaTransport::passive_reply(const Endpoint &ep, const std::string &requester_path) const {
    std::vector<uint32_t> qpn;
    for (auto *q : ep.qps) qpn.push_back(q->qp_num);
    const RdmaContext &c = *ctxs_[ep.nic];
    PortAddress pa = c.address();
    HandShakeDesc r =
        make_request(make_nic_path(opt_.server_name, c.name), requester_path, pa.lid, pa.gid_text, qpn);
    r.ready_ack = false;
    return encode_handshake(r);
}

Json RdmaTransport::handle_connection(const Json &request) {
    HandShakeDesc req = decode_handshake(request);
    std::vector<std::string> own;
    for (const auto &c : ctxs_) own.push_back(c->name);
    std::lock_guard<std::mutex> cg(passive_mu_);
    std::string dev_guess, server;
    split_nic_path(req.peer_nic_path, server, dev_guess);
    std::string key = dev_guess + "|" + req.local_nic_path;
    std::shared_ptr<Endpoint> cur;
    EndpointView view;
    {
        std::lock_guard<std::mutex> g(ep_mu_);
        auto it = passive_.find(key);
        if (it != passive_.end() && !it->second->broken.load()) {
            cur = it->second;
            view.state = cur->state;
            view.peer_nic_path = cur->peer_path;
            view.peer_qp_num = cur->peer_qpn;
        }
    }
    PassiveDecision dec = check_passive_request(req, opt_.server_name, own,
                                                static_cast<size_t>(cfg_.num_qp_per_ep), view);
    switch (dec.action) {
        case PassiveAction::Reject: return encode_handshake(reject_handshake(dec.reply_msg));
        case PassiveAction::AckAccepted: {
            // The endpoint may have been torn down for a late ACK meanwhile.
            std::lock_guard<std::mutex> g(ep_mu_);
            if (!cur || cur->broken.load())
                return encode_handshake(reject_handshake("the ready ACK for " + req.local_nic_path +
                                                         " came after the endpoint was torn down"));
            cur->state = EndpointState::Connected;
            return encode_handshake(empty_handshake());
        }
        case PassiveAction::Reuse:
            if (cur) return passive_reply(*cur, req.local_nic_path);
            return encode_handshake(reject_handshake("no endpoint to reuse"));
        case PassiveAction::Rebuild:
            if (cur) {
                drop_endpoint(cur);
                std::lock_guard<std::mutex> g(ep_mu_);
                graveyard_.push_back(cur);
                passive_.erase(key);
            }
            break;
        case PassiveAction::Connect: break;
    }
    return accept_passive(req, dec.local_device, key, dec.wait_for_ack);
}

Json RdmaTransport::accept_passive(const HandShakeDesc &req, const std::string &local_device,
                                   const std::string &key, bool wait_for_ack) {
    size_t nic = ctxs_.size();
    for (size_t i = 0; i < ctxs_.size(); ++i)
        if (ctxs_[i]->name == local_device) nic = i;
    if (nic == ctxs_.size() || !ctxs_[nic]->usable.load())
        return encode_handshake(reject_handshake("device " + local_device + " is not usable"));
    // An empty local_gid is looked up (with the LID) in the requester's
    // published devices[] by NIC name (docs/wire-protocol.md, RDMA endpoint
    // handshake).
    std::string gid_text = req.local_gid;
    uint32_t peer_lid = req.local_lid;
    if (gid_text.empty()) {
        std::string who = lookup_requester_gid(req.local_nic_path, gid_text, peer_lid);
        if (!who.empty()) return encode_handshake(reject_handshake(who));
    }
    auto g = parse_gid(gid_text);
    if (!g)
        return encode_handshake(reject_handshake("the GID '" + gid_text + "' of " + req.local_nic_path +
                                                 " is not a valid GID"));
    std::shared_ptr<Endpoint> ep;
    try {
        ep = create_qps(nic);
        ep->key = key;
        ep->peer_path = req.local_nic_path;
        connect_qps(*ep, req.qp_num, to_ibv_gid(*g), peer_lid);
    } catch (const Error &e) {
        if (ep)
            for (auto *q : ep->qps) lib_->api().destroy_qp(q);
        return encode_handshake(reject_handshake(e.what()));
    }
    ep->state = wait_for_ack ? EndpointState::WaitReadyAck : EndpointState::Connected;
    ep->ack_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.ready_ack_timeout_ms);
    Json out = passive_reply(*ep, req.local_nic_path);
    std::lock_guard<std::mutex> lg(ep_mu_);
    passive_[key] = ep;
    return out;
}

std::string RdmaTransport::lookup_requester_gid(const std::string &nic_path, std::string &gid,
                                                uint32_t &lid) {
    std::string server, dev;
    if (!split_nic_path(nic_path, server, dev))
        return "the request carries no local_gid and its local_nic_path '" + nic_path + "' is malformed";
    if (!opt_.fetch_descriptor)
        return "the request carries no local_gid and this engine cannot fetch descriptors; send the GID";
    SegmentDesc d;
    try {
        d = opt_.fetch_descriptor(server);
    } catch (const Error &e) {
        return "the request carries no local_gid and the descriptor of segment '" + server +
               "' could not be fetched: " + e.what();
    }
    for (const auto &x : d.devices)
        if (x.name == dev && !x.gid.empty()) {
            gid = x.gid;
            lid = x.lid;
            return "";
        }
    return "the request carries no local_gid and segment '" + server + "' publishes no device '" + dev +
           "' with a GID";
}


void RdmaTransport::expire_ack_waits() {
    auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> g(ep_mu_);
    for (auto it = passive_.begin(); it != passive_.end();) {
        auto &ep = it->second;
        if (ep->state == EndpointState::WaitReadyAck && now > ep->ack_deadline) {
            MC_LOG(Warn, "no ready ACK from " << ep->peer_path << " within " << opt_.ready_ack_timeout_ms
                                              << " ms; endpoint torn down");
            drop_endpoint(ep);
            graveyard_.push_back(ep);
            it = passive_.erase(it);
        } else {
            ++it;
        }
    }
}

void RdmaTransport::events_loop() {
    const auto &api = lib_->api();
    std::vector<pollfd> fds;
    for (auto &c : ctxs_) {
        int fl = fcntl(c->ctx->async_fd, F_GETFL);
        fcntl(c->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
        fds.push_back(pollfd{c->ctx->async_fd, POLLIN, 0});
    }
    while (!stop_.load()) {
        expire_ack_waits();
        for (auto &p : fds) p.revents = 0;
        int rc = ::poll(fds.data(), fds.size(), 50);
        if (rc <= 0) continue;
        for (size_t i = 0; i < fds.size(); ++i) {
            if (!(fds[i].revents & POLLIN)) continue;
            ibv::async_event ev{};
            if (api.get_async_event(ctxs_[i]->ctx, &ev) != 0) continue;
            int type = ev.event_type;
            ibv::qp *q = (type == ibv::IBV_EVENT_QP_FATAL || type == ibv::IBV_EVENT_QP_REQ_ERR ||
                          type == ibv::IBV_EVENT_QP_ACCESS_ERR)
                             ? ev.element.qp
                             : nullptr;
            api.ack_async_event(&ev);
            RdmaContext &c = *ctxs_[i];
            MC_LOG(Warn, "RDMA async event on " << c.name << ": " << ibv::event_type_name(type));
            // The GID (or LID/MTU) may have moved (docs/wire-protocol.md,
            // RDMA GID selection); the descriptor built from it is fresh on
            // the next read. Endpoints set up with the old
            // address go, so the next post re-handshakes.
            bool readdressed = (type == ibv::IBV_EVENT_GID_CHANGE || type == ibv::IBV_EVENT_PORT_ACTIVE) &&
                               refresh_port(i);
            std::lock_guard<std::mutex> g(ep_mu_);
            if (readdressed)
                for (auto *m : {&active_, &passive_})
                    for (auto &kv : *m)
                        if (kv.second->nic == i) drop_endpoint(kv.second);
            if (type == ibv::IBV_EVENT_PORT_ERR || type == ibv::IBV_EVENT_DEVICE_FATAL) {
                c.disabled_event.store(type);
                c.usable.store(false);
                usable_epoch_.fetch_add(1);
                for (auto *m : {&active_, &passive_})
                    for (auto &kv : *m)
                        if (kv.second->nic == i) drop_endpoint(kv.second);
            } else if (type == ibv::IBV_EVENT_PORT_ACTIVE) {
                c.usable.store(true);
                usable_epoch_.fetch_add(1);
            } else if (q) {
                for (auto *m : {&active_, &passive_})
                    for (auto &kv : *m)
                        for (auto *x : kv.second->qps)
                            if (x == q) drop_endpoint(kv.second);
            }
        }
    }
}


size_t RdmaTransport::rediscover() {
    size_t changed = 0;
    for (size_t i = 0; i < ctxs_.size(); ++i) {
        if (!refresh_port(i)) continue;
        ++changed;
        std::lock_guard<std::mutex> g(ep_mu_);
        for (auto *m : {&active_, &passive_})
            for (auto &kv : *m)
                if (kv.second->nic == i) drop_endpoint(kv.second);
    }
    return changed;
}

}  // namespace mcrs::rdma
