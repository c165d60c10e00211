// The engine's hot path allocates nothing once warm: with every operator
// new of this test binary counted (all threads: submitters, lanes, data
// servers), rounds of submit / wait / statuses / reset of a 32-request batch
// allocate zero times, over TCP and over the same-host path, once every
// lane is connected.
#include <atomic>
#include <cstdlib>
#include <new>

#include "engine_fixture.h"

namespace {
std::atomic<uint64_t> g_news{0};
}  // namespace

void *operator new(std::size_t n) {
    g_news.fetch_add(1, std::memory_order_relaxed);
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void *operator new[](std::size_t n) { return operator new(n); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
    g_news.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(n ? n : 1);
}
void *operator new[](std::size_t n, const std::nothrow_t &t) noexcept { return operator new(n, t); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }

using namespace mctest;

TEST(hot_path_allocates_nothing_once_warm) {
    for (bool same_host : {false, true}) {
        EngineOptions o;
        o.same_host = same_host;
        const uint64_t at_start = g_news.load();
        transfer_engine_t t = make_engine(o), i = make_engine(o);
        REQUIRE(t && i);
        CHECK(g_news.load() > at_start);  // the counter does count
        std::vector<char> tm(8 << 20), im(8 << 20);
        REQUIRE_EQ(registerLocalMemory(t, tm.data(), tm.size(), "cpu:0", 1), 0);
        REQUIRE_EQ(registerLocalMemory(i, im.data(), im.size(), "cpu:0", 0), 0);
        segment_id_t seg = openSegment(i, segment_name(t).c_str());
        REQUIRE(seg > 0);
        batch_id_t b = allocateBatchID(i, 32);
        transfer_request reqs[32];
        transfer_status st[32];
        for (int k = 0; k < 32; ++k)
            reqs[k] = {k % 2 ? OPCODE_WRITE : OPCODE_READ, im.data() + k * 4096, seg,
                       reinterpret_cast<uint64_t>(tm.data()) + k * 4096, 4096};
        // Lanes connect on first use and pull from one queue, so 4 KiB
        // batches may leave a lane idle (unconnected) for a long time under
        // load; its first connection would then allocate mid-measurement.
        // Warm-up batches of 32 x 256 KiB (8 MiB, several senders' worth)
        // put every lane to work first: connection setup is not hot path.
        transfer_request big[32];
        for (int k = 0; k < 32; ++k)
            big[k] = {k % 2 ? OPCODE_WRITE : OPCODE_READ, im.data() + (size_t(k) << 18), seg,
                      reinterpret_cast<uint64_t>(tm.data()) + (size_t(k) << 18), size_t(1) << 18};
        auto round = [&](transfer_request *rq) {
            REQUIRE_EQ(submitTransfer(i, b, rq, 32), 0);
            REQUIRE_EQ(mc_batch_wait(i, b, 10000), 0);
            size_t n = 0;
            REQUIRE_EQ(mc_batch_status(i, b, st, 32, &n), 0);
            for (auto &s : st) REQUIRE_EQ(s.status, STATUS_COMPLETED);
            REQUIRE_EQ(mc_batch_reset(i, b), 0);
        };
        for (int r = 0; r < 20; ++r) round(big);
        for (int r = 0; r < 50; ++r) round(reqs);
        uint64_t before = g_news.load();
        for (int r = 0; r < 300; ++r) round(reqs);
        uint64_t allocs = g_news.load() - before;
        if (allocs != 0) std::fprintf(stderr, "same_host=%d: %llu allocations\n", same_host ? 1 : 0,
                                      static_cast<unsigned long long>(allocs));
        CHECK_EQ(allocs, 0u);
        freeBatchID(i, b);
        destroyTransferEngine(i);
        destroyTransferEngine(t);
    }
}
