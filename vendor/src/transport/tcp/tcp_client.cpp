#include "transport/tcp/tcp_client.h"

#include <utility>

#include "common/host_port.h"
#include "transport/tcp/tcp_lane.h"
#include "transport/tcp/tcp_peer.h"

namespace mcrs {

using tcp::Clock;
using tcp::kCoalesceBytes;
using tcp::Lane;
using tcp::Queued;

TcpClient::Peer::Peer(std::string h, uint16_t p, const TcpClientOptions &o)
    : host(std::move(h)), port(p), label(join_host_port(host, p)), opt(o) {
    for (uint32_t i = 0; i < opt.lanes_per_peer; ++i) {
        lanes_.push_back(std::make_unique<Lane>(*this, static_cast<int>(i)));
        lanes_.back()->start();
    }
}

TcpClient::Peer::~Peer() { stop(); }

void TcpClient::Peer::enqueue(std::vector<TransferItem> &items, int version) {
    bool rejected = false;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (!stopping_)
            for (auto &it : items) queue_.push_back(Queued{std::move(it), version});
        else
            rejected = true;
    }
    if (rejected) {
        for (auto &it : items) it.fail("the engine is shutting down");
        return;
    }
    cv_.notify_all();
}

void TcpClient::Peer::requeue_front(std::vector<Queued> &items) {
    bool stopping;
    {
        std::lock_guard<std::mutex> g(mu_);
        stopping = stopping_;
        if (!stopping)
            for (size_t i = items.size(); i-- > 0;) queue_.push_front(std::move(items[i]));
    }
    if (stopping) {
        for (auto &q : items) q.item.fail("the engine is shutting down");
        return;
    }
    cv_.notify_all();
}

bool TcpClient::Peer::pop_many(std::vector<Queued> &out, size_t max_items) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return false;
    uint64_t bytes = 0;
    while (!queue_.empty() && out.size() < max_items) {
        uint64_t len = queue_.front().item.length;
        if (!out.empty() && bytes + len > kCoalesceBytes) break;
        bytes += len;
        out.push_back(queue_.pop_front());
    }
    // Others may find work left.
    if (!queue_.empty()) cv_.notify_one();
    return true;
}

bool TcpClient::Peer::recent_connect_failure(std::string &why) {
    std::lock_guard<std::mutex> g(mu_);
    if (failure_.empty()) return false;
    if (Clock::now() - failed_at_ > std::chrono::seconds(1)) {
        failure_.clear();
        return false;
    }
    why = failure_;
    return true;
}

void TcpClient::Peer::note_connect_failure(const std::string &why) {
    std::lock_guard<std::mutex> g(mu_);
    failed_at_ = Clock::now();
    failure_ = why;
}

void TcpClient::Peer::stop() {
    std::vector<Queued> left;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_ && lanes_.empty()) return;
        stopping_ = true;
        while (!queue_.empty()) left.push_back(queue_.pop_front());
    }
    cv_.notify_all();
    for (auto &q : left) q.item.fail("the engine is shutting down");
    for (auto &l : lanes_) l->stop();
    lanes_.clear();
}

TcpClient::TcpClient(TcpClientOptions opt) : opt_(opt) {}

TcpClient::~TcpClient() { stop(); }

void TcpClient::submit(const std::string &host, uint16_t port, int proto_version,
                       std::vector<TransferItem> &items) {
    std::shared_ptr<Peer> peer;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopped_) {
            for (auto &it : items) it.fail("the engine is shutting down");
            return;
        }
        for (auto &p : peers_)
            if (p->port == port && p->host == host) {
                peer = p;
                break;
            }
        if (!peer) {
            peer = std::make_shared<Peer>(host, port, opt_);
            peers_.push_back(peer);
        }
    }
    submitted_.fetch_add(items.size(), std::memory_order_relaxed);
    peer->enqueue(items, proto_version);
}

void TcpClient::stop() {
    std::vector<std::shared_ptr<Peer>> peers;
    {
        std::lock_guard<std::mutex> g(mu_);
        stopped_ = true;
        peers.swap(peers_);
    }
    for (auto &p : peers) p->stop();
}

}  // namespace mcrs
