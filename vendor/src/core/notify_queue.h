// Notifications received from peers (handshake type 2), drained FIFO by the
// application. Bounded in entries, in bytes (name + message) and per message,
// so a peer cannot grow our memory without limit (docs/wire-protocol.md,
// Notifications).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mcrs {

struct Notification {
    std::string name;
    std::string msg;
};

struct NotifyLimits {
    uint64_t max_entries = 1u << 20;
    uint64_t max_bytes = uint64_t(64) << 20;
    uint64_t max_message_bytes = 64u << 10;
};

class NotifyQueue {
public:
    enum class Push { Ok, Full, TooLarge };
    explicit NotifyQueue(NotifyLimits limits) : lim_(limits) {}
    // Anything but Ok: refused (the sender is told it failed).
    Push push(Notification n);
    std::vector<Notification> drain();
    size_t size() const;
    uint64_t queued_bytes() const;
    uint64_t refused() const;

private:
    mutable std::mutex mu_;
    std::deque<Notification> q_;
    NotifyLimits lim_;
    uint64_t bytes_ = 0;
    uint64_t refused_ = 0;
};

}  // namespace mcrs
