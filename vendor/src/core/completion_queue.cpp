#include "core/completion_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace mcrs {

int CompletionQueue::enable(std::string &err) {
    std::lock_guard<std::mutex> g(mu_);
    if (!fd_.valid()) {
        int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0) {
            err = std::string("eventfd: ") + std::strerror(errno);
            return -1;
        }
        fd_.reset(fd);
        enabled_.store(true, std::memory_order_release);
    }
    return fd_.get();
}

void CompletionQueue::raise_locked() {
    if (raised_ || !fd_.valid()) return;
    const uint64_t one = 1;
    // Only EAGAIN (a counter at its maximum, already readable) can fail.
    ssize_t w = ::write(fd_.get(), &one, sizeof one);
    (void)w;
    raised_ = true;
}

void CompletionQueue::batch_finished(uint64_t batch_id) {
    if (!enabled()) return;
    std::lock_guard<std::mutex> g(mu_);
    if (ids_.size() - head_ >= kMaxQueued) {
        overflowed_ = true;
    } else {
        try {
            ids_.push_back(batch_id);
        } catch (const std::bad_alloc &) {
            overflowed_ = true;
        }
    }
    raise_locked();
}

void CompletionQueue::signal() {
    if (!enabled()) return;
    std::lock_guard<std::mutex> g(mu_);
    raise_locked();
}

size_t CompletionQueue::take(uint64_t *out, size_t cap, bool &overflowed) {
    std::lock_guard<std::mutex> g(mu_);
    size_t n = 0;
    while (n < cap && head_ < ids_.size()) out[n++] = ids_[head_++];
    if (head_ == ids_.size()) {
        ids_.clear();
        head_ = 0;
    } else if (head_ >= 4096 && head_ * 2 >= ids_.size()) {
        // A reader that never empties the queue (finishers keep up with it)
        // must not let the taken prefix grow with the total throughput.
        ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(head_));
        head_ = 0;
    }
    overflowed = overflowed_;
    overflowed_ = false;
    // Ids left for the next call keep the fd readable; an empty queue lets
    // the next event write it again.
    raised_ = false;
    if (head_ < ids_.size()) raise_locked();
    return n;
}

}  // namespace mcrs
