// RdmaTransport: construction (verbs, discovery, the poller and events
// threads), teardown (flush, drain, free in reverse order) and counters.
// The other concerns live in rdma_discovery.cpp, rdma_memory.cpp,
// rdma_endpoints.cpp, rdma_completion.cpp and rdma_datapath.cpp.
#include "transport/rdma/rdma_transport.h"

#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/error.h"
#include "transport/rdma/rdma_transport_internal.h"

namespace mcrs::rdma {

RdmaTransport::RdmaTransport(RdmaTransportOptions opt, RdmaConfig cfg)
    : opt_(std::move(opt)),
      cfg_(std::move(cfg)),
      rails_(RailPolicy{5, 5000, static_cast<int64_t>(cfg_.rail_pause_seconds) * 1000}) {
    try {
        lib_ = &ibv::VerbsLibrary::load(opt_.verbs_library);
    } catch (const Error &e) {
        throw Error(kErrContext, std::string("cannot start the RDMA transport: ") + e.what() +
                                     ". Install rdma-core (libibverbs.so.1), point MC_VERBS_LIBRARY "
                                     "at a verbs library, or use the TCP protocol");
    }
    discover();
    poller_ = std::thread([this] { poller_loop(); });
    events_ = std::thread([this] { events_loop(); });
}

RdmaTransport::~RdmaTransport() {
    // Flush everything in flight: every QP to ERR, then let the poller
    // drain the flush completions (bounded wait); nothing is re-posted.
    closing_.store(true);
    {
        std::lock_guard<std::mutex> g(ep_mu_);
        for (auto *m : {&active_, &passive_})
            for (auto &kv : *m) drop_endpoint(kv.second);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (inflight_.load() > 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop_.store(true);
    if (poller_.joinable()) poller_.join();
    if (events_.joinable()) events_.join();
    for (auto *s : pending_) finish_slice(s, false, "the RDMA transport is shutting down");
    pending_.clear();
    const auto &api = lib_->api();
    std::lock_guard<std::mutex> g(ep_mu_);
    for (auto *m : {&active_, &passive_})
        for (auto &kv : *m)
            for (auto *q : kv.second->qps) api.destroy_qp(q);
    active_.clear();
    passive_.clear();
    for (auto &gy : graveyard_)
        for (auto *q : gy->qps) api.destroy_qp(q);
    graveyard_.clear();
    // With every QP gone no completion can name these any more.
    {
        std::lock_guard<std::mutex> pg(posted_mu_);
        for (auto *z : zombies_) delete z;
        zombies_.clear();
        for (auto *s : posted_) finish_slice(s, false, "the RDMA transport is shutting down");
        posted_.clear();
    }
    {
        std::lock_guard<std::mutex> r(reg_mu_);
        for (auto &kv : regs_) {
            for (auto *m : kv.second.mrs)
                if (m) api.dereg_mr(m);
            if (kv.second.dmabuf_fd >= 0) ::close(kv.second.dmabuf_fd);
        }
        regs_.clear();
    }
    for (auto &c : ctxs_) {
        if (c->cq) api.destroy_cq(c->cq);
        if (c->pd) api.dealloc_pd(c->pd);
        if (c->ctx) api.close_device(c->ctx);
    }
}

std::vector<RdmaNicCounters> RdmaTransport::counters() const {
    std::vector<RdmaNicCounters> out;
    for (const auto &c : ctxs_) {
        RdmaNicCounters n;
        n.name = c->name;
        n.link_layer = link_layer_name(c->link_layer);
        n.numa_node = c->numa_node;
        n.usable = c->usable.load();
        n.wrs = c->wrs.load();
        n.bytes = c->bytes.load();
        n.errors = c->errors.load();
        n.retries = c->retries.load();
        n.inflight_bytes = c->inflight_bytes.load();
        n.ewma_bps = c->ewma_bps.load();
        out.push_back(n);
    }
    return out;
}

}  // namespace mcrs::rdma
