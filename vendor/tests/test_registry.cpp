#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/error.h"
#include "core/memory_registry.h"
#include "test_util.h"

using namespace mcrs;

static int add_code(MemoryRegistry &r, void *p, size_t n) {
    try {
        r.add(reinterpret_cast<uint64_t>(p), n, "cpu:0", true);
        return 0;
    } catch (const Error &e) {
        return e.code();
    }
}

TEST(registry_overlap_and_lookup) {
    std::vector<char> mem(1 << 16);
    MemoryRegistry r;
    char *b = mem.data();
    CHECK_EQ(add_code(r, b + 1024, 1024), 0);
    CHECK_EQ(add_code(r, b + 1024, 1024), kErrAddressOverlapped);
    CHECK_EQ(add_code(r, b + 1500, 10), kErrAddressOverlapped);
    CHECK_EQ(add_code(r, b + 1000, 100), kErrAddressOverlapped);
    CHECK_EQ(add_code(r, b, 1024), 0);         // adjacent below
    CHECK_EQ(add_code(r, b + 2048, 1024), 0);  // adjacent above
    CHECK_EQ(add_code(r, b + 4096, 0), kErrInvalidArgument);
    CHECK_EQ(add_code(r, nullptr, 16), kErrInvalidArgument);
    CHECK(r.pin(reinterpret_cast<uint64_t>(b + 1024), 1024, true));
    CHECK(!r.pin(reinterpret_cast<uint64_t>(b + 1024), 1025, true));  // spans two regions
    CHECK(!r.pin(reinterpret_cast<uint64_t>(b + 1023), 2, true));
    CHECK(!r.pin(reinterpret_cast<uint64_t>(b + 1024), 0, true));
    CHECK(!r.pin(UINT64_MAX - 4, 16, true));
    r.remove(reinterpret_cast<uint64_t>(b + 1024));
    CHECK(!r.pin(reinterpret_cast<uint64_t>(b + 1024), 1, true));
    bool threw = false;
    try {
        r.remove(reinterpret_cast<uint64_t>(b + 1024));
    } catch (const Error &e) {
        threw = e.code() == kErrAddressNotRegistered;
    }
    CHECK(threw);
}

TEST(registry_local_only_is_not_remote) {
    std::vector<char> mem(4096);
    MemoryRegistry r;
    r.add(reinterpret_cast<uint64_t>(mem.data()), mem.size(), "cpu:0", false);
    CHECK(r.pin(reinterpret_cast<uint64_t>(mem.data()), 16, false));
    CHECK(!r.pin(reinterpret_cast<uint64_t>(mem.data()), 16, true));
    CHECK(r.snapshot(true).empty());
    CHECK_EQ(r.snapshot(false).size(), 1u);
}

TEST(registry_rejects_unmapped_memory) {
    long page = 4096;
    void *p = mmap(nullptr, page * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    munmap(static_cast<char *>(p) + page * 2, page);  // hole in the middle
    MemoryRegistry r;
    CHECK_EQ(add_code(r, p, page * 4), kErrInvalidArgument);
    CHECK_EQ(add_code(r, p, page * 2), 0);
    r.clear();
    munmap(p, page * 2);
    munmap(static_cast<char *>(p) + page * 3, page);
}

TEST(registry_batch_is_all_or_nothing) {
    std::vector<char> mem(8192);
    MemoryRegistry r;
    uint64_t b = reinterpret_cast<uint64_t>(mem.data());
    bool threw = false;
    try {
        r.add_batch({{b, 100, true, ""}, {b + 50, 100, true, ""}});
    } catch (const Error &e) {
        threw = e.code() == kErrAddressOverlapped;
    }
    CHECK(threw);
    CHECK_EQ(r.size(), 0u);
    r.add_batch({{b, 100, true, ""}, {b + 100, 100, true, ""}});
    CHECK_EQ(r.size(), 2u);
}

TEST(registry_remove_waits_for_pins) {
    std::vector<char> mem(4096);
    MemoryRegistry r;
    uint64_t a = reinterpret_cast<uint64_t>(mem.data());
    r.add(a, mem.size(), "", true);
    RegionPin pin = r.pin(a, 10, true);
    REQUIRE(pin);
    std::atomic<bool> removed{false};
    std::thread t([&] {
        r.remove(a);
        removed = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(!removed.load());
    // New pins fail at once: the region left the map before the wait.
    CHECK(!r.pin(a, 10, true));
    pin.release();
    t.join();
    CHECK(removed.load());
}

TEST(registry_shared_pins_are_counted_and_waited_for) {
    // A submit shares the previous request's pin when its region holds the
    // next range: every shared pin counts, from whichever thread drops it.
    std::vector<char> mem(1 << 16);
    MemoryRegistry r;
    uint64_t a = reinterpret_cast<uint64_t>(mem.data());
    r.add(a, mem.size(), "", true);
    RegionPin first = r.pin(a, 64, false);
    REQUIRE(first);
    std::vector<RegionPin> shared;
    for (int i = 0; i < 1000; ++i) shared.push_back(first.share());
    CHECK(shared.back().region() == first.region());
    first.release();
    CHECK(!r.wait_idle(a, 0));  // 1000 shared pins still held
    std::atomic<bool> removed{false};
    std::thread remover([&] {
        r.remove(a);
        removed = true;
    });
    // Released concurrently by four threads, as transports complete them.
    std::vector<std::thread> releasers;
    for (int t = 0; t < 4; ++t)
        releasers.emplace_back([&, t] {
            for (size_t i = static_cast<size_t>(t); i < shared.size(); i += 4) {
                if (t == 0 && i == 400) std::this_thread::sleep_for(std::chrono::milliseconds(50));
                shared[i].release();
            }
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(!removed.load());
    for (auto &t : releasers) t.join();
    remover.join();
    CHECK(removed.load());
    // A default (empty) pin shares nothing.
    CHECK(!RegionPin().share());
}
