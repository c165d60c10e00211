// Readiness for async callers: the ids of batches whose submitted requests
// have all finished, and an eventfd that is readable once there is news
// (a finished batch, or a notification from a peer) since it was last read.
// Off until the caller asks for the fd, so blocking users pay one relaxed
// load per finished batch. Bounded: past kMaxQueued ids it records an
// overflow instead, and the caller then re-checks every batch it waits for
// (as an event queue that overflows tells its reader to rescan).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/socket.h"

namespace mcrs {

class CompletionQueue {
public:
    static constexpr size_t kMaxQueued = 65536;

    // The eventfd (created on the first call); -1 with `err` set when the
    // kernel refuses one.
    int enable(std::string &err);
    bool enabled() const { return enabled_.load(std::memory_order_acquire); }

    // A batch whose submitted requests have all finished.
    void batch_finished(uint64_t batch_id);
    // Something else the caller waits for (a notification) arrived.
    void signal();

    // Moves up to `cap` ids, oldest first, into `out`; `overflowed` tells
    // whether ids were dropped since the last call (cleared by it). The
    // caller reads the eventfd before calling: the other order can miss a
    // batch that finishes in between.
    size_t take(uint64_t *out, size_t cap, bool &overflowed);

private:
    void raise_locked();

    std::atomic<bool> enabled_{false};
    std::mutex mu_;
    Fd fd_;
    std::vector<uint64_t> ids_;
    size_t head_ = 0;  // ids_[head_..] are not taken yet
    bool overflowed_ = false;
    bool raised_ = false;  // the fd was written since the queue was last empty
};

}  // namespace mcrs
