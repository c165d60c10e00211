// The handshake/RPC listener. Unlike upstream's serial loop, one thread
// multiplexes every connection with poll(), each under its own deadline, so
// a slow or silent client never delays anybody else's handshake. One source
// address may hold only a share of the connections (and sources outside the
// optional allow-list none), so one client cannot crowd out the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <atomic>
#include <functional>
#include <list>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/admission.h"
#include "common/json.h"
#include "common/peer_filter.h"
#include "common/socket.h"

namespace mcrs {

struct HandshakeServerOptions {
    uint32_t timeout_ms = 5000;  // per connection, from accept to close
    uint64_t max_length = 1u << 20;
    uint32_t max_connections = 256;
    // 0 = max(8, max_connections / 8).
    uint32_t max_connections_per_source = 0;
    PeerFilter allowed_peers;
};

class HandshakeServer {
public:
    // Fills `reply` for a request of `type`; returning false closes the
    // connection without a reply. Runs on the server thread; must be quick.
    using Handler = std::function<bool(uint8_t type, const Json &request, Json &reply)>;

    HandshakeServer(Fd listener, HandshakeServerOptions opt, Handler handler);
    ~HandshakeServer();
    HandshakeServer(const HandshakeServer &) = delete;
    HandshakeServer &operator=(const HandshakeServer &) = delete;

    void start();
    void stop();
    // Connections closed at accept (allow-list, per-source cap) or shed.
    uint64_t refused_connections() const { return admission_.refused(); }

private:
    struct Conn;
    void run();
    void accept_all();
    // Returns false when the connection is finished and must be closed.
    bool on_readable(Conn &c);
    bool on_writable(Conn &c);
    void build_reply(Conn &c);

    Fd listener_;
    HandshakeServerOptions opt_;
    Handler handler_;
    WakePipe wake_;
    std::thread thread_;
    std::atomic<bool> stopping_{false};
    void erase(std::list<Conn>::iterator it);

    std::list<Conn> conns_;
    SourceAdmission admission_;  // listener thread only
};

}  // namespace mcrs
