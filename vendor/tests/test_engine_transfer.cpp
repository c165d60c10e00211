// Two real engines in one process over TCP on 127.0.0.1: data moved in both
// directions and verified byte by byte.
#include <atomic>
#include <thread>

#include "engine_fixture.h"

using namespace mctest;

namespace {

struct Pair {
    transfer_engine_t target = nullptr;
    transfer_engine_t init = nullptr;
    std::vector<char> tmem, imem;
    segment_id_t seg = -1;

    explicit Pair(size_t bytes, EngineOptions o = {}) : tmem(bytes), imem(bytes) {
        target = make_engine(o);
        init = make_engine(o);
        REQUIRE(target && init);
        REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
        REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "cpu:0", 1), 0);
        seg = openSegment(init, segment_name(target).c_str());
        REQUIRE(seg > 0);
    }
    ~Pair() {
        destroyTransferEngine(init);
        destroyTransferEngine(target);
    }
    uint64_t taddr(size_t off) const { return reinterpret_cast<uint64_t>(tmem.data()) + off; }
    transfer_request req(int op, size_t local_off, size_t remote_off, size_t len) {
        return transfer_request{op, imem.data() + local_off, seg, taddr(remote_off), len};
    }
};

}  // namespace

TEST(engine_read_write_sizes_1b_to_64mib) {
    const size_t kMax = 64u << 20;
    Pair p(kMax + 4096);
    fill_random(p.tmem, 1);
    const size_t sizes[] = {1, 7, 4096, 65535, 65536, 65537, (1u << 20) + 3, kMax};
    for (size_t sz : sizes) {
        // READ: remote -> local, local poisoned first.
        std::memset(p.imem.data(), 0x5A, sz + 1);
        auto st = run_batch(p.init, {p.req(OPCODE_READ, 0, 13 % (4096), sz)});
        REQUIRE_EQ(st.size(), 1u);
        CHECK_EQ(st[0], STATUS_COMPLETED);
        CHECK(std::memcmp(p.imem.data(), p.tmem.data() + 13, sz) == 0);
        CHECK_EQ(p.imem[sz], static_cast<char>(0x5A));  // nothing past the end
        // WRITE: local -> remote.
        std::vector<char> src(sz);
        fill_random(src, static_cast<uint32_t>(sz));
        std::memcpy(p.imem.data(), src.data(), sz);
        char guard = p.tmem[sz + 100];
        st = run_batch(p.init, {p.req(OPCODE_WRITE, 0, 100, sz)});
        CHECK_EQ(st[0], STATUS_COMPLETED);
        CHECK(std::memcmp(p.tmem.data() + 100, src.data(), sz) == 0);
        CHECK_EQ(p.tmem[sz + 100], guard);
    }
}

TEST(engine_batches_1_to_1024_requests) {
    const size_t kBlock = 4096;
    Pair p(1024 * kBlock * 2);
    fill_random(p.tmem, 7);
    for (size_t n : {1u, 2u, 17u, 256u, 1024u}) {
        std::memset(p.imem.data(), 0, p.imem.size());
        std::vector<transfer_request> reqs;
        // Scatter: request i reads remote block (n-1-i) into local block i.
        for (size_t i = 0; i < n; ++i)
            reqs.push_back(p.req(OPCODE_READ, i * kBlock, (n - 1 - i) * kBlock, kBlock));
        auto st = run_batch(p.init, reqs);
        REQUIRE_EQ(st.size(), n);
        for (size_t i = 0; i < n; ++i) {
            CHECK_EQ(st[i], STATUS_COMPLETED);
            CHECK(std::memcmp(p.imem.data() + i * kBlock, p.tmem.data() + (n - 1 - i) * kBlock,
                              kBlock) == 0);
        }
    }
}

TEST(engine_mixed_read_write_in_one_batch) {
    const size_t kBlock = 1 << 16;
    Pair p(64 * kBlock);
    fill_random(p.tmem, 3);
    fill_random(p.imem, 4);
    std::vector<char> t0 = p.tmem, i0 = p.imem;
    std::vector<transfer_request> reqs;
    for (size_t i = 0; i < 32; ++i) {
        if (i % 2 == 0) reqs.push_back(p.req(OPCODE_READ, i * kBlock, i * kBlock, kBlock));
        else reqs.push_back(p.req(OPCODE_WRITE, i * kBlock, i * kBlock, kBlock));
    }
    auto st = run_batch(p.init, reqs);
    for (size_t i = 0; i < 32; ++i) {
        CHECK_EQ(st[i], STATUS_COMPLETED);
        if (i % 2 == 0)
            CHECK(std::memcmp(p.imem.data() + i * kBlock, t0.data() + i * kBlock, kBlock) == 0);
        else
            CHECK(std::memcmp(p.tmem.data() + i * kBlock, i0.data() + i * kBlock, kBlock) == 0);
    }
}

// Small WRITE payloads come through the target's read-ahead buffer (many
// requests per recv), larger ones straight into memory. A batch of every
// size around the switch, interleaved with READs of the same bytes, and
// thousands of 4 KiB scattered WRITEs, must land byte for byte.
TEST(engine_small_and_large_writes_interleaved) {
    const size_t sizes[] = {1, 8, 17, 4095, 4096, 4097, 16383, 16384, 16385, 65536, 1 << 20};
    const size_t kSlot = (1 << 20) + 4096;
    const size_t n = 3 * (sizeof sizes / sizeof sizes[0]);
    Pair p(n * kSlot);
    fill_random(p.imem, 11);
    fill_random(p.tmem, 12);
    std::vector<char> t0 = p.tmem;
    std::vector<transfer_request> reqs;
    for (size_t i = 0; i < n; ++i) {
        size_t sz = sizes[i % (sizeof sizes / sizeof sizes[0])];
        // Every third request READs a slot no WRITE touches.
        int op = i % 3 == 2 ? OPCODE_READ : OPCODE_WRITE;
        reqs.push_back(p.req(op, i * kSlot, i * kSlot + 5, sz));
    }
    std::vector<char> i0 = p.imem;
    auto st = run_batch(p.init, reqs);
    REQUIRE_EQ(st.size(), n);
    for (size_t i = 0; i < n; ++i) {
        CHECK_EQ(st[i], STATUS_COMPLETED);
        size_t sz = reqs[i].length;
        if (reqs[i].opcode == OPCODE_WRITE) {
            CHECK(std::memcmp(p.tmem.data() + i * kSlot + 5, i0.data() + i * kSlot, sz) == 0);
            CHECK_EQ(p.tmem[i * kSlot + 5 + sz], t0[i * kSlot + 5 + sz]);  // nothing past the end
        } else {
            CHECK(std::memcmp(p.imem.data() + i * kSlot, t0.data() + i * kSlot + 5, sz) == 0);
        }
    }
    // 8,192 scattered 4 KiB WRITEs: local block i to remote block 2i+1.
    const size_t kBlock = 4096, kBlocks = 8192;
    Pair q(2 * kBlocks * kBlock + kBlock);
    fill_random(q.imem, 13);
    std::vector<char> q0 = q.tmem;
    std::vector<transfer_request> many;
    for (size_t i = 0; i < kBlocks; ++i)
        many.push_back(q.req(OPCODE_WRITE, i * kBlock, (2 * i + 1) * kBlock, kBlock));
    st = run_batch(q.init, many);
    REQUIRE_EQ(st.size(), kBlocks);
    size_t bad = 0;
    for (size_t i = 0; i < kBlocks; ++i) {
        bad += st[i] != STATUS_COMPLETED;
        bad += std::memcmp(q.tmem.data() + (2 * i + 1) * kBlock, q.imem.data() + i * kBlock, kBlock) != 0;
        bad += std::memcmp(q.tmem.data() + 2 * i * kBlock, q0.data() + 2 * i * kBlock, kBlock) != 0;
    }
    CHECK_EQ(bad, 0u);
}

TEST(engine_many_threads_submit_and_poll) {
    const size_t kThreads = 8, kPer = 64, kBlock = 8192;
    Pair p(kThreads * kPer * kBlock);
    fill_random(p.tmem, 11);
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (size_t t = 0; t < kThreads; ++t) {
        ts.emplace_back([&, t] {
            for (int round = 0; round < 4; ++round) {
                std::vector<transfer_request> reqs;
                for (size_t i = 0; i < kPer; ++i) {
                    size_t off = (t * kPer + i) * kBlock;
                    reqs.push_back(p.req(OPCODE_READ, off, off, kBlock));
                }
                batch_id_t b = allocateBatchID(p.init, kPer);
                if (submitTransfer(p.init, b, reqs.data(), reqs.size()) != 0) {
                    ++bad;
                    continue;
                }
                // Busy-poll like upstream's Python binding does.
                for (size_t i = 0; i < kPer; ++i) {
                    transfer_status st{};
                    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                    do {
                        getTransferStatus(p.init, b, i, &st);
                    } while (st.status == STATUS_WAITING &&
                             std::chrono::steady_clock::now() < deadline);
                    if (st.status != STATUS_COMPLETED || st.transferred_bytes != kBlock) ++bad;
                }
                if (freeBatchID(p.init, b) != 0) ++bad;
            }
        });
    }
    for (auto &t : ts) t.join();
    CHECK_EQ(bad.load(), 0);
    CHECK(std::memcmp(p.imem.data(), p.tmem.data(), p.tmem.size()) == 0);
}

TEST(engine_legacy_v1_framing) {
    EngineOptions o;
    o.proto_version = 1;
    // v1 WRITEs complete once sent, so only a READ on the same connection
    // (one lane, served in order) is sure to see the written bytes.
    o.lanes = 1;
    Pair p(1 << 20, o);
    fill_random(p.tmem, 21);
    auto st = run_batch(p.init, {p.req(OPCODE_READ, 0, 0, 300000)});
    CHECK_EQ(st[0], STATUS_COMPLETED);
    CHECK(std::memcmp(p.imem.data(), p.tmem.data(), 300000) == 0);
    fill_random(p.imem, 22);
    st = run_batch(p.init, {p.req(OPCODE_WRITE, 0, 4096, 5000)});
    CHECK_EQ(st[0], STATUS_COMPLETED);
    // Read back to be sure it landed.
    std::vector<char> copy(p.imem.begin(), p.imem.begin() + 5000);
    st = run_batch(p.init, {p.req(OPCODE_READ, 8192, 4096, 5000)});
    CHECK_EQ(st[0], STATUS_COMPLETED);
    CHECK(std::memcmp(p.imem.data() + 8192, copy.data(), 5000) == 0);
}

TEST(engine_local_segment_copy) {
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    std::vector<char> a(1 << 16), b(1 << 16);
    fill_random(a, 5);
    REQUIRE_EQ(registerLocalMemory(e, a.data(), a.size(), "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, b.data(), b.size(), "*", 0), 0);
    auto st = run_batch(e, {transfer_request{OPCODE_READ, b.data(), LOCAL_SEGMENT,
                                             reinterpret_cast<uint64_t>(a.data()), a.size()}});
    CHECK_EQ(st[0], STATUS_COMPLETED);
    CHECK(a == b);
    // The local-only buffer is not a valid target, even locally.
    st = run_batch(e, {transfer_request{OPCODE_WRITE, a.data(), LOCAL_SEGMENT,
                                        reinterpret_cast<uint64_t>(b.data()), 16}});
    CHECK_EQ(st[0], STATUS_FAILED);
    destroyTransferEngine(e);
}

TEST(engine_notify_with_batch_and_direct) {
    Pair p(1 << 16);
    notify_msg_t n{const_cast<char *>("prefill-0"), const_cast<char *>("kv-ready:req-1")};
    batch_id_t b = allocateBatchID(p.init, 2);
    std::vector<transfer_request> reqs = {p.req(OPCODE_WRITE, 0, 0, 100),
                                          p.req(OPCODE_WRITE, 100, 100, 100)};
    REQUIRE_EQ(submitTransferWithNotify(p.init, b, reqs.data(), reqs.size(), n), 0);
    REQUIRE_EQ(mc_batch_wait(p.init, b, 10000), 0);
    // Sent synchronously by the thread that saw the batch complete.
    int count = 0;
    notify_msg_t *msgs = getNotifsFromEngine(p.target, &count);
    REQUIRE_EQ(count, 1);
    CHECK_EQ(std::string(msgs[0].name), std::string("prefill-0"));
    CHECK_EQ(std::string(msgs[0].msg), std::string("kv-ready:req-1"));
    freeNotifsMsgBuf(msgs, count);
    CHECK_EQ(freeBatchID(p.init, b), 0);

    notify_msg_t d{const_cast<char *>("x"), const_cast<char *>("direct")};
    CHECK_EQ(genNotifyInEngine(p.init, static_cast<uint64_t>(p.seg), d), 0);
    msgs = getNotifsFromEngine(p.target, &count);
    REQUIRE_EQ(count, 1);
    CHECK_EQ(std::string(msgs[0].msg), std::string("direct"));
    freeNotifsMsgBuf(msgs, count);
    CHECK(getNotifsFromEngine(p.target, &count) == nullptr);
    CHECK_EQ(count, 0);
    CHECK_EQ(genNotifyInEngine(p.init, 9999, d), ERR_METADATA);
}

TEST(engine_probe_and_segment_buffers) {
    Pair p(1 << 16);
    CHECK_EQ(mc_segment_probe(p.init, p.seg), 0);
    mc_buffer_info_t info[4];
    size_t count = 0;
    CHECK_EQ(mc_segment_buffers(p.init, p.seg, info, 4, &count), 0);
    REQUIRE_EQ(count, 1u);
    CHECK_EQ(info[0].addr, p.taddr(0));
    CHECK_EQ(info[0].length, p.tmem.size());
    char proto[16];
    CHECK_EQ(mc_segment_protocol(p.init, p.seg, proto, sizeof proto), 0);
    CHECK_EQ(std::string(proto), std::string("tcp"));
    // Buffers registered later appear after a refresh.
    std::vector<char> more(4096);
    REQUIRE_EQ(registerLocalMemory(p.target, more.data(), more.size(), "*", 1), 0);
    CHECK_EQ(openSegmentNoCache(p.init, segment_name(p.target).c_str()), p.seg);
    CHECK_EQ(mc_segment_buffers(p.init, p.seg, info, 4, &count), 0);
    CHECK_EQ(count, 2u);
    CHECK_EQ(syncSegmentCache(p.init), 0);
    char ipport[64];
    CHECK_EQ(getLocalIpAndPort(p.target, ipport, sizeof ipport), 0);
    CHECK_EQ(std::string(ipport), segment_name(p.target));
}

TEST(engine_memory_location_of_registered_buffers) {
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    std::vector<char> a(8192), b(8192);
    REQUIRE_EQ(registerLocalMemory(e, a.data(), a.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, b.data(), b.size(), "*", 1), 0);
    char loc[32] = {0};
    CHECK_EQ(mc_memory_location(e, a.data() + 100, loc, sizeof loc), 0);
    CHECK_EQ(std::string(loc), std::string("cpu:0"));
    // "*" becomes the NUMA node of the first page (or stays "*" without NUMA).
    CHECK_EQ(mc_memory_location(e, b.data(), loc, sizeof loc), 0);
    CHECK(std::string(loc).rfind("cpu:", 0) == 0 || std::string(loc) == "*");
    std::vector<char> c(64);
    CHECK_EQ(mc_memory_location(e, c.data(), loc, sizeof loc), ERR_ADDRESS_NOT_REGISTERED);
    CHECK(std::string(mc_last_error_message()).find("no registered buffer") != std::string::npos);
    CHECK_EQ(mc_memory_location(e, a.data(), loc, 2), MC_ERR_BUFFER_TOO_SMALL);
    destroyTransferEngine(e);
}

TEST(engine_mixed_big_reads_and_writes_on_one_lane_do_not_stall) {
    // One connection, runs that mix READs (whose data the target must send
    // back) with WRITEs (whose payload we are still sending): neither side
    // may wait for the other to finish first. Progress timeout 3 s.
    EngineOptions o;
    o.lanes = 1;
    Pair p(64u << 20, o);
    fill_random(p.tmem, 11);
    fill_random(p.imem, 12);
    for (size_t block : {size_t(128) << 10, size_t(512) << 10}) {
        std::vector<transfer_request> reqs;
        const size_t n = (32u << 20) / block;
        for (size_t i = 0; i < n; ++i) {
            size_t off = i * block;
            reqs.push_back(p.req(i % 2 ? OPCODE_WRITE : OPCODE_READ, off, (i % 2 ? (32u << 20) : 0) + off, block));
        }
        auto st = run_batch(p.init, reqs, 20000);
        REQUIRE_EQ(st.size(), n);
        for (int s : st) CHECK_EQ(s, STATUS_COMPLETED);
        for (size_t i = 0; i < n; i += 2)
            CHECK(std::memcmp(p.imem.data() + i * block, p.tmem.data() + i * block, block) == 0);
        for (size_t i = 1; i < n; i += 2)
            CHECK(std::memcmp(p.tmem.data() + (32u << 20) + i * block, p.imem.data() + i * block, block) == 0);
    }
}
