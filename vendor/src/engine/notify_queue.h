// Notifications received from peers (handshake type 2), drained FIFO by the
// application. Bounded, so a peer cannot grow our memory without limit.
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

class NotifyQueue {
public:
    explicit NotifyQueue(uint64_t capacity) : capacity_(capacity) {}
    // False when the queue is full (the sender is told it failed).
    bool push(Notification n);
    std::vector<Notification> drain();
    size_t size() const;

private:
    mutable std::mutex mu_;
    std::deque<Notification> q_;
    uint64_t capacity_;
};

}  // namespace mcrs
