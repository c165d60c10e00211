#include "core/notify_queue.h"

namespace mcrs {

NotifyQueue::Push NotifyQueue::push(Notification n) {
    const uint64_t cost = n.name.size() + n.msg.size();
    std::lock_guard<std::mutex> g(mu_);
    Push r = Push::Ok;
    if (cost > lim_.max_message_bytes) r = Push::TooLarge;
    else if (q_.size() >= lim_.max_entries || bytes_ + cost > lim_.max_bytes) r = Push::Full;
    if (r != Push::Ok) {
        ++refused_;
        return r;
    }
    bytes_ += cost;
    q_.push_back(std::move(n));
    return r;
}

std::vector<Notification> NotifyQueue::drain() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<Notification> out(std::make_move_iterator(q_.begin()),
                                  std::make_move_iterator(q_.end()));
    q_.clear();
    bytes_ = 0;
    return out;
}

size_t NotifyQueue::size() const {
    std::lock_guard<std::mutex> g(mu_);
    return q_.size();
}

uint64_t NotifyQueue::queued_bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    return bytes_;
}

uint64_t NotifyQueue::refused() const {
    std::lock_guard<std::mutex> g(mu_);
    return refused_;
}

}  // namespace mcrs
