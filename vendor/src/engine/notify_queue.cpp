#include "engine/notify_queue.h"

namespace mcrs {

bool NotifyQueue::push(Notification n) {
    std::lock_guard<std::mutex> g(mu_);
    if (q_.size() >= capacity_) return false;
    q_.push_back(std::move(n));
    return true;
}

std::vector<Notification> NotifyQueue::drain() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<Notification> out(std::make_move_iterator(q_.begin()),
                                  std::make_move_iterator(q_.end()));
    q_.clear();
    return out;
}

size_t NotifyQueue::size() const {
    std::lock_guard<std::mutex> g(mu_);
    return q_.size();
}

}  // namespace mcrs
