// The TCP data server: serves peers' READ and WRITE requests straight from
// and into registered memory. Each request must lie inside one registered,
// remote-accessible buffer (upstream issue #2313 let any peer read or write
// anything); the buffer stays pinned while its bytes move. Idle connections
// are kept open indefinitely, as upstream clients require.
//
// Each connection has one thread. It parses every request header that has
// arrived before answering, and answers pipelined requests with as few
// sendmsg calls as it can (status frames and READ data gathered into one
// iovec list, flushed before it would block on input or when it holds
// kMaxOutBytes), so that small requests cost a fraction of a syscall each.
// The same-host path's opcodes are not served here: a TCP peer's words
// prove nothing about who it is (see transport/samehost).
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "common/socket.h"
#include "engine/memory_registry.h"

namespace mcrs {

struct TcpServerOptions {
    uint32_t progress_timeout_ms = 30000;
    uint32_t max_connections = 1024;
    // Accept same-host sessions (see EngineConfig::enable_same_host).
    bool enable_same_host = true;
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
    uint64_t same_host_served() const { return same_host_served_.load(); }

    class Conn;

private:
    struct Session {
        Fd fd;
        std::thread thread;
        std::atomic<bool> done{false};
    };
    void accept_loop();
    void serve(Session *s);
    void reap_finished();  // caller holds mu_

    Fd listener_;
    const MemoryRegistry &registry_;
    TcpServerOptions opt_;
    WakePipe wake_;
    std::thread acceptor_;
    std::atomic<bool> stopping_{false};
    std::mutex mu_;
    std::list<std::unique_ptr<Session>> sessions_;
    std::atomic<uint64_t> rejected_{0};
    std::atomic<uint64_t> served_{0};
    std::atomic<uint64_t> same_host_served_{0};
};

}  // namespace mcrs
