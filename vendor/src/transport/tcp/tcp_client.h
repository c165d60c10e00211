// The TCP initiator. Per peer (host, port) it keeps a small pool of
// persistent connections ("lanes"). Each lane pipelines requests: a sender
// thread takes a run of queued requests at once and writes their headers
// (and WRITE payloads, straight from the caller's registered memory) with
// one sendmsg; a receiver thread reads the answers of every request in
// flight with as few readv calls as it can, READ data straight into
// registered memory, in request order. Every blocking call is bounded by
// the progress timeout, so a dead or silent peer ends in FAILED, never a
// hang. Nothing is allocated per request once the queues have grown to
// their working size. (Same-host peers have their own transport:
// transport/samehost.)
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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

// A FIFO on a power-of-two ring that grows (never shrinks), so steady-state
// pushes and pops allocate nothing.
template <class T>
class Ring {
public:
    explicit Ring(size_t cap = 16) {
        size_t c = 1;
        while (c < cap) c <<= 1;
        buf_.resize(c);
    }
    bool empty() const { return size_ == 0; }
    size_t size() const { return size_; }
    T &front() { return buf_[head_]; }
    T &back() { return buf_[(head_ + size_ - 1) & (buf_.size() - 1)]; }
    T &at(size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }
    // May reallocate (and move every element) when full.
    void push_back(T &&v) {
        if (size_ == buf_.size()) grow();
        buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
        ++size_;
    }
    // Puts `v` ahead of every queued element (a request sent again).
    void push_front(T &&v) {
        if (size_ == buf_.size()) grow();
        head_ = (head_ + buf_.size() - 1) & (buf_.size() - 1);
        buf_[head_] = std::move(v);
        ++size_;
    }
    T pop_front() {
        T v = std::move(buf_[head_]);
        buf_[head_] = T();
        head_ = (head_ + 1) & (buf_.size() - 1);
        --size_;
        return v;
    }

private:
    void grow() {
        std::vector<T> n(buf_.size() * 2);
        for (size_t i = 0; i < size_; ++i) n[i] = std::move(at(i));
        buf_.swap(n);
        head_ = 0;
    }
    std::vector<T> buf_;
    size_t head_ = 0, size_ = 0;
};

class TcpClient {
public:
    explicit TcpClient(TcpClientOptions opt);
    ~TcpClient();
    TcpClient(const TcpClient &) = delete;
    TcpClient &operator=(const TcpClient &) = delete;

    // Queues the items for the data server at host:port. `proto_version` is
    // the framing to use (1 or 2). Never blocks on the network.
    void submit(const std::string &host, uint16_t port, int proto_version, std::vector<TransferItem> &items);
    // Fails everything queued or in flight and joins all threads.
    void stop();
    uint64_t requests_submitted() const { return submitted_.load(std::memory_order_relaxed); }

    class Peer;

private:
    TcpClientOptions opt_;
    std::mutex mu_;
    bool stopped_ = false;
    std::vector<std::shared_ptr<Peer>> peers_;
    std::atomic<uint64_t> submitted_{0};
};

}  // namespace mcrs
