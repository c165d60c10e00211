// The TCP initiator. Per peer (host, port) it keeps a small pool of
// persistent connections ("lanes"). Each lane pipelines requests: a sender
// thread writes headers and WRITE payloads straight from the caller's
// registered memory, a receiver thread reads status frames and READ data
// straight into it, in request order. Every blocking call is bounded by the
// progress timeout, so a dead or silent peer ends in FAILED, never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "transport/transport.h"

namespace mcrs {

struct TcpClientOptions {
    uint32_t connect_timeout_ms = 5000;
    uint32_t progress_timeout_ms = 30000;
    uint32_t lanes_per_peer = 4;
    uint32_t pipeline_depth = 64;
};

class TcpClient {
public:
    explicit TcpClient(TcpClientOptions opt);
    ~TcpClient();
    TcpClient(const TcpClient &) = delete;
    TcpClient &operator=(const TcpClient &) = delete;

    // Queues the items for the data server at host:port. `proto_version` is
    // the framing to use (1 or 2). Never blocks on the network.
    void submit(const std::string &host, uint16_t port, int proto_version,
                std::vector<TransferItem> &items);
    // Fails everything queued or in flight and joins all threads.
    void stop();
    uint64_t requests_submitted() const { return submitted_.load(std::memory_order_relaxed); }

    class Peer;

private:
    TcpClientOptions opt_;
    std::mutex mu_;
    bool stopped_ = false;
    std::map<std::string, std::shared_ptr<Peer>> peers_;
    std::atomic<uint64_t> submitted_{0};
};

}  // namespace mcrs
