// Async readiness: the completion queue on its own (order, the eventfd's
// readiness, the overflow bound), and through the C API with two real
// engines on 127.0.0.1: finished batches and arriving notifications make
// the engine's event fd readable, with no polling of statuses.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/completion_queue.h"
#include "engine_fixture.h"

using namespace mctest;
using mcrs::CompletionQueue;

namespace {

bool readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

void consume(int fd) {
    uint64_t v = 0;
    ssize_t r = ::read(fd, &v, sizeof v);
    (void)r;
}

}  // namespace

TEST(completion_queue_off_until_enabled) {
    CompletionQueue q;
    q.batch_finished(7);  // off: not recorded
    uint64_t ids[4];
    bool over = true;
    CHECK_EQ(q.take(ids, 4, over), 0u);
    CHECK(!over);
    std::string err;
    int fd = q.enable(err);
    REQUIRE(fd >= 0);
    CHECK_EQ(q.enable(err), fd);  // one fd per queue
    CHECK(!readable(fd, 0));
    q.batch_finished(1);
    q.batch_finished(2);
    q.batch_finished(3);
    CHECK(readable(fd, 0));
    consume(fd);
    // A smaller cap leaves ids behind, and the fd readable for them.
    CHECK_EQ(q.take(ids, 2, over), 2u);
    CHECK_EQ(ids[0], 1u);
    CHECK_EQ(ids[1], 2u);
    CHECK(readable(fd, 0));
    consume(fd);
    CHECK_EQ(q.take(ids, 4, over), 1u);
    CHECK_EQ(ids[0], 3u);
    CHECK(!readable(fd, 0));
    // A notification alone makes it readable too.
    q.signal();
    CHECK(readable(fd, 0));
    consume(fd);
    CHECK_EQ(q.take(ids, 4, over), 0u);
    CHECK(!readable(fd, 0));
}

TEST(completion_queue_overflow_is_reported_not_grown) {
    CompletionQueue q;
    std::string err;
    int fd = q.enable(err);
    REQUIRE(fd >= 0);
    for (uint64_t i = 0; i < CompletionQueue::kMaxQueued + 100; ++i) q.batch_finished(i);
    consume(fd);
    std::vector<uint64_t> ids(CompletionQueue::kMaxQueued + 100);
    bool over = false;
    CHECK_EQ(q.take(ids.data(), ids.size(), over), CompletionQueue::kMaxQueued);
    CHECK(over);
    CHECK_EQ(ids[CompletionQueue::kMaxQueued - 1], CompletionQueue::kMaxQueued - 1);
    CHECK_EQ(q.take(ids.data(), ids.size(), over), 0u);
    CHECK(!over);  // reported once
}

// Many threads finishing batches while one reader drains as an async
// reactor does (read the fd, then take): every id arrives exactly once
// and no wakeup is lost.
TEST(completion_queue_no_lost_wakeups) {
    CompletionQueue q;
    std::string err;
    int fd = q.enable(err);
    REQUIRE(fd >= 0);
    const uint64_t per = 20000, writers = 4;
    std::vector<std::thread> ts;
    for (uint64_t w = 0; w < writers; ++w)
        ts.emplace_back([&, w] {
            for (uint64_t i = 0; i < per; ++i) q.batch_finished(w * per + i + 1);
        });
    std::vector<uint8_t> seen(writers * per + 1, 0);
    uint64_t got = 0;
    bool stalled = false, dup = false;
    std::vector<uint64_t> ids(1000);
    while (got < writers * per) {
        if (!readable(fd, 5000)) {
            stalled = true;
            break;
        }
        consume(fd);
        bool over = false;
        size_t n;
        while ((n = q.take(ids.data(), ids.size(), over)) > 0)
            for (size_t i = 0; i < n; ++i) {
                dup = dup || seen[ids[i]];
                seen[ids[i]] = 1;
                ++got;
            }
        CHECK(!over);
    }
    for (auto &t : ts) t.join();
    CHECK(!stalled);
    CHECK(!dup);
    CHECK_EQ(got, writers * per);
}

TEST(engine_event_fd_reports_finished_batches_and_notifies) {
    transfer_engine_t target = make_engine(), init = make_engine();
    REQUIRE(target && init);
    std::vector<char> tmem(1 << 20), imem(1 << 20);
    fill_random(tmem, 3);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "cpu:0", 1), 0);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    REQUIRE(seg > 0);
    int fd = -1, fd2 = -1;
    REQUIRE_EQ(mc_engine_event_fd(init, &fd), 0);
    REQUIRE_EQ(mc_engine_event_fd(init, &fd2), 0);
    CHECK_EQ(fd, fd2);
    CHECK(!readable(fd, 0));
    const uint64_t taddr = reinterpret_cast<uint64_t>(tmem.data());
    batch_id_t a = allocateBatchID(init, 8), b = allocateBatchID(init, 8);
    std::vector<transfer_request> ra, rb;
    for (size_t i = 0; i < 8; ++i) {
        ra.push_back({OPCODE_READ, imem.data() + i * 4096, seg, taddr + i * 4096, 4096});
        rb.push_back({OPCODE_READ, imem.data() + (64 + i) * 4096, seg, taddr + (64 + i) * 4096, 4096});
    }
    REQUIRE_EQ(submitTransfer(init, a, ra.data(), ra.size()), 0);
    REQUIRE_EQ(submitTransfer(init, b, rb.data(), rb.size()), 0);
    // Both batches show up, each once, without asking for any status.
    std::vector<batch_id_t> seen;
    for (int round = 0; round < 10 && seen.size() < 2; ++round) {
        if (!readable(fd, 5000)) break;
        consume(fd);
        batch_id_t ids[8];
        size_t n = 0;
        int over = 1;
        REQUIRE_EQ(mc_engine_take_completions(init, ids, 8, &n, &over), 0);
        CHECK_EQ(over, 0);
        seen.insert(seen.end(), ids, ids + n);
    }
    REQUIRE_EQ(seen.size(), 2u);
    CHECK((seen[0] == a && seen[1] == b) || (seen[0] == b && seen[1] == a));
    CHECK_EQ(mc_batch_wait(init, a, 0), 0);
    CHECK_EQ(mc_batch_wait(init, b, 0), 0);
    CHECK(std::memcmp(imem.data(), tmem.data(), 8 * 4096) == 0);
    CHECK(std::memcmp(imem.data() + 64 * 4096, tmem.data() + 64 * 4096, 8 * 4096) == 0);
    CHECK_EQ(freeBatchID(init, a), 0);
    CHECK_EQ(freeBatchID(init, b), 0);
    CHECK(!readable(fd, 0));
    // A notification arriving at an engine with its fd on.
    int tfd = -1;
    REQUIRE_EQ(mc_engine_event_fd(target, &tfd), 0);
    notify_msg_t msg{const_cast<char *>("p"), const_cast<char *>("ready")};
    REQUIRE_EQ(genNotifyInEngine(init, static_cast<uint64_t>(seg), msg), 0);
    CHECK(readable(tfd, 5000));
    int count = 0;
    notify_msg_t *msgs = getNotifsFromEngine(target, &count);
    CHECK_EQ(count, 1);
    freeNotifsMsgBuf(msgs, count);
    // Bad arguments are errors, not crashes.
    size_t n = 0;
    int over = 0;
    CHECK(mc_engine_take_completions(init, nullptr, 4, &n, &over) != 0);
    CHECK(mc_engine_take_completions(init, nullptr, 0, &n, &over) == 0);
    CHECK(mc_engine_event_fd(init, nullptr) != 0);
    CHECK(mc_engine_event_fd(nullptr, &fd) != 0);
    destroyTransferEngine(init);
    destroyTransferEngine(target);
}
