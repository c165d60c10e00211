#include "core/batch.h"

#include <chrono>

namespace mcrs {

Batch::Batch(uint64_t id, size_t capacity, std::shared_ptr<CompletionQueue> completions)
    : id_(id), capacity_(capacity), tasks_(new Task[capacity]), completions_(std::move(completions)) {}

std::optional<size_t> Batch::reserve(size_t n) {
    std::lock_guard<std::mutex> g(mu_);
    size_t cur = submitted_.load(std::memory_order_relaxed);
    if (n > capacity_ - cur) return std::nullopt;
    submitted_.store(cur + n, std::memory_order_release);
    return cur;
}

void Batch::finish_one() {
    size_t done = finished_.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (done == submitted_.load(std::memory_order_acquire)) {
        {
            std::lock_guard<std::mutex> g(mu_);
            cv_.notify_all();
        }
        if (completions_) completions_->batch_finished(id_);
    }
}

void Batch::set_parts(size_t i, uint64_t parts) {
    tasks_[i].parts_left.store(parts == 0 ? 1 : parts, std::memory_order_relaxed);
}

void Batch::complete(size_t i, uint64_t bytes) {
    Task &t = tasks_[i];
    t.transferred.fetch_add(bytes, std::memory_order_relaxed);
    // The last piece decides; its acquire sees every earlier piece's bytes
    // and, after a failed piece, the error that piece wrote.
    if (t.parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    settle(t);
}

void Batch::fail(size_t i, const std::string &why) {
    Task &t = tasks_[i];
    if (!t.part_failed.exchange(true, std::memory_order_acq_rel)) t.error = why;
    if (t.parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    settle(t);
}

void Batch::settle(Task &t) {
    if (t.part_failed.load(std::memory_order_acquire)) {
        t.transferred.store(0, std::memory_order_relaxed);
        t.status.store(kTaskFailed, std::memory_order_release);
        failed_.fetch_add(1, std::memory_order_relaxed);
    } else {
        t.status.store(kTaskCompleted, std::memory_order_release);
    }
    finish_one();
}

int Batch::observe(size_t i, uint64_t *bytes) {
    Task &t = tasks_[i];
    int s = t.status.load(std::memory_order_acquire);
    if (bytes) *bytes = t.transferred.load(std::memory_order_relaxed);
    if (is_terminal(s)) t.observed.store(true, std::memory_order_relaxed);
    return s;
}

bool Batch::all_observed() const {
    size_t n = submitted_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i)
        if (!tasks_[i].observed.load(std::memory_order_relaxed)) return false;
    return true;
}

bool Batch::all_completed() const {
    size_t n = submitted_.load(std::memory_order_acquire);
    return n > 0 && finished_.load(std::memory_order_acquire) == n &&
           failed_.load(std::memory_order_relaxed) == 0;
}

bool Batch::wait(int64_t timeout_ms) {
    std::unique_lock<std::mutex> g(mu_);
    auto done = [this] {
        return finished_.load(std::memory_order_acquire) ==
               submitted_.load(std::memory_order_acquire);
    };
    if (timeout_ms < 0) {
        cv_.wait(g, done);
        return true;
    }
    return cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), done);
}

bool Batch::reset() {
    std::lock_guard<std::mutex> g(mu_);
    size_t n = submitted_.load(std::memory_order_acquire);
    if (finished_.load(std::memory_order_acquire) != n) return false;
    for (size_t i = 0; i < n; ++i)
        if (!tasks_[i].observed.load(std::memory_order_relaxed)) return false;
    // Every task is terminal and seen: no transport touches them any more.
    for (size_t i = 0; i < n; ++i) {
        Task &t = tasks_[i];
        t.status.store(kTaskWaiting, std::memory_order_relaxed);
        t.transferred.store(0, std::memory_order_relaxed);
        t.observed.store(false, std::memory_order_relaxed);
        t.parts_left.store(1, std::memory_order_relaxed);
        t.part_failed.store(false, std::memory_order_relaxed);
        t.error.clear();
    }
    failed_.store(0, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    submitted_.store(0, std::memory_order_release);
    notify_.reset();
    return true;
}

void Batch::set_notify(PendingNotify n) {
    std::lock_guard<std::mutex> g(mu_);
    notify_ = std::move(n);
}

std::optional<PendingNotify> Batch::take_notify_if_complete() {
    if (!all_completed()) return std::nullopt;
    std::lock_guard<std::mutex> g(mu_);
    std::optional<PendingNotify> out;
    out.swap(notify_);
    return out;
}

std::shared_ptr<Batch> BatchTable::create(size_t capacity) {
    std::unique_lock<std::shared_mutex> g(mu_);
    uint64_t id = next_id_++;
    auto b = std::make_shared<Batch>(id, capacity, completions_);
    batches_.emplace(id, b);
    return b;
}

std::shared_ptr<Batch> BatchTable::find(uint64_t id) const {
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = batches_.find(id);
    return it == batches_.end() ? nullptr : it->second;
}

bool BatchTable::erase_if_idle(uint64_t id, bool &found) {
    std::unique_lock<std::shared_mutex> g(mu_);
    auto it = batches_.find(id);
    found = it != batches_.end();
    if (!found) return false;
    if (!it->second->all_observed()) return false;
    batches_.erase(it);
    return true;
}

std::vector<std::shared_ptr<Batch>> BatchTable::all() const {
    std::shared_lock<std::shared_mutex> g(mu_);
    std::vector<std::shared_ptr<Batch>> out;
    for (const auto &kv : batches_) out.push_back(kv.second);
    return out;
}

void BatchTable::clear() {
    std::unique_lock<std::shared_mutex> g(mu_);
    batches_.clear();
}

}  // namespace mcrs
