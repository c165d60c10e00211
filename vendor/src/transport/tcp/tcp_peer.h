// Private to transport/tcp: the TCP initiator's per-peer queue
// (TcpClient::Peer), which its lanes (tcp_lane.h) take runs of requests
// from (see tcp_client.h for the design).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/tcp_client.h"
#include "transport/transport.h"

namespace mcrs {

namespace tcp {

using Clock = std::chrono::steady_clock;

// A sender takes at most this many bytes of requests at once, so that big
// transfers spread over the lanes while small ones share syscalls.
constexpr uint64_t kCoalesceBytes = 1u << 20;
// Answers read by one receiver pass (two iovec entries each at most).
constexpr size_t kMaxRecvBatch = 128;
// iovec entries per sendmsg (IOV_MAX is 1024).
constexpr size_t kMaxSendIov = 512;

struct Queued {
    TransferItem item;
    int version = 2;
};

class Lane;

}  // namespace tcp

class TcpClient::Peer {
public:
    Peer(std::string host, uint16_t port, const TcpClientOptions &opt);
    ~Peer();

    void enqueue(std::vector<TransferItem> &items, int version);
    // Blocks until items are available, then moves up to `max_items` of them
    // (at least one; at most kCoalesceBytes of requests unless the first
    // alone is bigger) into `out`. False once the peer is stopping.
    bool pop_many(std::vector<tcp::Queued> &out, size_t max_items);
    // Puts requests the target never served back at the head of the queue,
    // in their order, for whichever lane is free (they fail at once when
    // the peer is stopping).
    void requeue_front(std::vector<tcp::Queued> &items);
    void stop();

    const std::string host;
    const uint16_t port;
    const std::string label;  // "host:port" for messages
    const TcpClientOptions opt;

    // Connect failures are shared by all lanes: after one, lanes that have no
    // connection fail their items at once for a short cool-down instead of
    // each waiting out its own connect timeout.
    bool recent_connect_failure(std::string &why);
    void note_connect_failure(const std::string &why);

private:
    std::mutex mu_;
    std::condition_variable cv_;
    Ring<tcp::Queued> queue_{256};
    bool stopping_ = false;
    tcp::Clock::time_point failed_at_{};
    std::string failure_;
    std::vector<std::unique_ptr<tcp::Lane>> lanes_;
};

}  // namespace mcrs
