// Batches and tasks with upstream's status codes and lifecycle: a batch has a
// fixed capacity, submits append tasks, a task is WAITING until a transport
// finishes it, and a batch can be freed only once every task has been seen
// terminal by the caller. Batch ids are opaque counters checked on every
// call, so a stale or forged id is an error, never a wild pointer.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/completion_queue.h"

namespace mcrs {

enum TaskStatus : int {
    kTaskWaiting = 0,
    kTaskPending = 1,
    kTaskInvalid = 2,
    kTaskCanceled = 3,
    kTaskCompleted = 4,
    kTaskTimeout = 5,
    kTaskFailed = 6,
};

inline bool is_terminal(int s) {
    return s == kTaskCompleted || s == kTaskFailed || s == kTaskTimeout || s == kTaskCanceled;
}

// A task is one request, or one block list (TransferEngine::submit_blocks)
// made of many pieces: it turns terminal when its last piece finishes,
// COMPLETED only when every piece completed.
struct Task {
    std::atomic<int> status{kTaskWaiting};
    std::atomic<uint64_t> transferred{0};
    std::atomic<bool> observed{false};  // terminal status reported to the caller
    std::atomic<uint64_t> parts_left{1};
    std::atomic<bool> part_failed{false};  // the first failed piece wrote `error`
    std::string error;                     // set before status turns FAILED
};

struct PendingNotify {
    int32_t segment_id = 0;
    std::string name;
    std::string msg;
};

class Batch {
public:
    // `completions` (may be null) hears when every submitted task has
    // finished.
    Batch(uint64_t id, size_t capacity, std::shared_ptr<CompletionQueue> completions = nullptr);

    uint64_t id() const { return id_; }
    size_t capacity() const { return capacity_; }
    size_t submitted() const { return submitted_.load(std::memory_order_acquire); }

    // Reserves `n` task slots; returns the first index, or nullopt when the
    // batch would exceed its capacity.
    std::optional<size_t> reserve(size_t n);
    Task &task(size_t i) { return tasks_[i]; }

    // Makes task `i` (reserved, nothing dispatched yet) wait for `parts`
    // pieces (>= 1) instead of one.
    void set_parts(size_t i, uint64_t parts);
    // Called exactly once per piece by whoever finishes it.
    void complete(size_t i, uint64_t bytes);
    void fail(size_t i, const std::string &why);

    // Marks `i` observed if terminal; returns its status.
    int observe(size_t i, uint64_t *bytes);
    bool all_observed() const;
    bool all_completed() const;
    size_t finished() const { return finished_.load(std::memory_order_acquire); }
    // Waits until every submitted task is terminal or the timeout expires
    // (timeout_ms < 0 waits forever). Returns true when all are terminal.
    bool wait(int64_t timeout_ms);

    // Empties the batch for reuse once every submitted task has been
    // observed terminal; false (batch untouched) otherwise.
    bool reset();

    void set_notify(PendingNotify n);
    // Hands out the pending notify once, when every task has completed.
    std::optional<PendingNotify> take_notify_if_complete();

private:
    void finish_one();
    void settle(Task &t);  // the task's last piece finished

    uint64_t id_;
    size_t capacity_;
    std::unique_ptr<Task[]> tasks_;
    std::atomic<size_t> submitted_{0};
    std::atomic<size_t> finished_{0};
    std::atomic<size_t> failed_{0};
    std::mutex mu_;  // reserve, notify, and the wait condition
    std::condition_variable cv_;
    std::optional<PendingNotify> notify_;
    std::shared_ptr<CompletionQueue> completions_;
};

class BatchTable {
public:
    std::shared_ptr<Batch> create(size_t capacity);
    std::shared_ptr<Batch> find(uint64_t id) const;
    // Erases the batch when every task has been observed terminal; returns
    // false (batch kept) otherwise.
    bool erase_if_idle(uint64_t id, bool &found);
    std::vector<std::shared_ptr<Batch>> all() const;
    void clear();
    // Where this table's batches report that they finished.
    CompletionQueue &completions() { return *completions_; }

private:
    std::shared_ptr<CompletionQueue> completions_ = std::make_shared<CompletionQueue>();
    mutable std::shared_mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<Batch>> batches_;
    uint64_t next_id_ = 1;
};

}  // namespace mcrs
