// The TCP data server: serves peers' READ and WRITE requests straight from
// and into registered memory. Each request must lie inside one registered,
// remote-accessible buffer (upstream issue #2313 let any peer read or write
// anything); the buffer stays pinned while its bytes move.
//
// One event-loop thread (epoll) owns every connection that waits for its
// next request; a bounded pool of workers serves connections whose input is
// ready and hands each back to the loop once its input is drained, so idle
// connections cost no thread. Limits, so that one client cannot exhaust the
// port: a total connection cap, a per-source-address cap, an optional
// allow-list of source networks, and idle deadlines (a fresh connection must
// send a complete request header within idle_timeout_ms; a pooled one may
// wait pooled_idle_timeout_ms between requests, as upstream clients keep
// their connections; inside a request the progress timeout applies).
//
// A worker parses every request header that has arrived before answering,
// and answers pipelined requests with as few sendmsg calls as it can
// (status frames and READ data gathered into one iovec list, flushed before
// it would wait for input or when it holds kMaxOutBytes), so that small
// requests cost a fraction of a syscall each. The same-host path's opcodes
// are not served here: a TCP peer's words prove nothing about who it is
// (see transport/samehost).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/admission.h"
#include "common/peer_filter.h"
#include "common/socket.h"
#include "core/memory_registry.h"

namespace mcrs {

struct TcpHeader;

struct TcpServerOptions {
    uint32_t progress_timeout_ms = 30000;
    uint32_t max_connections = 1024;
    // 0 = max(8, max_connections / 8).
    uint32_t max_connections_per_source = 0;
    // A fresh connection must complete its first request header in time.
    uint32_t idle_timeout_ms = 5000;
    // A connection that has served a request may wait this long for the next.
    uint32_t pooled_idle_timeout_ms = 120000;
    // Worker threads; 0 = a default from the core count (8..64).
    uint32_t workers = 0;
    PeerFilter allowed_peers;
};

class TcpServer {
public:
    TcpServer(Fd listener, const MemoryRegistry &registry, TcpServerOptions opt);
    ~TcpServer();
    TcpServer(const TcpServer &) = delete;
    TcpServer &operator=(const TcpServer &) = delete;

    void start();
    void stop();
    uint64_t rejected_requests() const { return rejected_.load(); }
    uint64_t served_requests() const { return served_.load(); }
    // Connections closed at accept (caps, allow-list) or for idleness.
    uint64_t refused_connections() const { return admission_.refused(); }
    uint64_t idle_closed_connections() const { return idle_closed_.load(); }
    size_t connection_count() const;

    class Conn;

private:
    using Clock = std::chrono::steady_clock;
    struct Session {
        Fd fd;
        std::string source;
        std::unique_ptr<Conn> conn;
        Clock::time_point deadline;
        bool in_loop = true;      // waiting in epoll (else a worker has it)
        bool served_any = false;  // a complete request header arrived
        bool partial = false;     // a request header is half here
    };
    enum class Pass { Idle, Again, Close };

    void loop();
    void worker();
    void accept_all();
    void expire_idle(Clock::time_point now);
    Pass serve(Session &s);
    // The steps of serve(), one request each; false closes the connection.
    bool serve_request(Conn &c, const TcpHeader &h);
    void reject_request(Conn &c, const TcpHeader &h);
    bool serve_gpu_request(Conn &c, const TcpHeader &h, RegionPin &pin);
    bool serve_staged_gpu_write(Conn &c, const TcpHeader &h, RegionPin &pin);
    bool serve_host_request(Conn &c, const TcpHeader &h, RegionPin &pin);
    void finish(Session *s, Pass p);
    void erase_locked(Session *s);  // caller holds mu_

    Fd listener_;
    const MemoryRegistry &registry_;
    TcpServerOptions opt_;
    SourceAdmission admission_;  // under mu_
    Fd epoll_;
    WakePipe wake_;
    std::thread loop_thread_;
    std::vector<std::thread> workers_;
    std::atomic<bool> stopping_{false};

    mutable std::mutex mu_;
    std::condition_variable ready_cv_;
    // Connections with input ready, FIFO; a ring with room for every
    // connection (each is queued at most once), so queueing never allocates.
    std::vector<Session *> ready_;
    size_t ready_head_ = 0, ready_len_ = 0;
    void push_ready_locked(Session *s);
    std::atomic<size_t> ready_count_{0};
    std::atomic<size_t> idle_workers_{0};
    std::unordered_map<Session *, std::unique_ptr<Session>> sessions_;
    Clock::time_point next_scan_;

    std::atomic<uint64_t> rejected_{0};
    std::atomic<uint64_t> served_{0};
    std::atomic<uint64_t> idle_closed_{0};
};

}  // namespace mcrs
