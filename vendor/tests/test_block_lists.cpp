// Block-list transfers (mc_submit_blocks): one task per list, every piece
// moved byte for byte over TCP and into the local segment (other routes take
// the pieces through the same dispatch as requests; the CUDA IPC kernel path
// is in test_gpu.cpp), and every malformed list refused with its cause
// before the batch changes.
#include <cstring>
#include <string>
#include <vector>

#include "engine_fixture.h"

using namespace mctest;

namespace {

constexpr size_t kBlock = 4096;
constexpr size_t kBlocks = 64;  // per region and side
constexpr size_t kRegions = 3;

// Both engines' memory: kRegions regions of kBlocks blocks, one after another.
struct BlockPair {
    transfer_engine_t target = nullptr, init = nullptr;
    std::vector<char> tmem, imem;
    segment_id_t seg = -1;

    explicit BlockPair(EngineOptions o = {}) : tmem(kRegions * kBlocks * kBlock), imem(tmem.size()) {
        target = make_engine(o);
        init = make_engine(o);
        REQUIRE(target && init);
        REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
        REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "cpu:0", 1), 0);
        seg = openSegment(init, segment_name(target).c_str());
        REQUIRE(seg > 0);
    }
    ~BlockPair() {
        destroyTransferEngine(init);
        destroyTransferEngine(target);
    }
    std::vector<mc_block_region_t> regions(size_t len = kBlock) const {
        std::vector<mc_block_region_t> r;
        for (size_t g = 0; g < kRegions; ++g)
            r.push_back(mc_block_region_t{reinterpret_cast<uint64_t>(imem.data() + g * kBlocks * kBlock),
                                          reinterpret_cast<uint64_t>(tmem.data() + g * kBlocks * kBlock), kBlock,
                                          kBlock, len});
        return r;
    }
};

struct Outcome {
    int submit = -1;
    size_t task = SIZE_MAX;
    transfer_status st{};
    std::string error;
    size_t submitted = 0;
};

Outcome run_blocks(transfer_engine_t e, int op, segment_id_t seg, const std::vector<mc_block_region_t> &r,
                   const std::vector<uint64_t> &local, const std::vector<uint64_t> &remote) {
    Outcome o;
    batch_id_t b = allocateBatchID(e, 4);
    o.submit = mc_submit_blocks(e, b, op, seg, r.data(), r.size(), local.data(), remote.data(), local.size(), &o.task);
    if (o.submit == 0) {
        mc_batch_wait(e, b, 20000);
        getTransferStatus(e, b, o.task, &o.st);
        char why[512];
        size_t need = 0;
        mc_transfer_error(e, b, o.task, why, sizeof why, &need);
        o.error = why;
    } else {
        o.error = mc_last_error_message();
    }
    mc_batch_status(e, b, nullptr, 0, &o.submitted);
    freeBatchID(e, b);
    return o;
}

// Scattered ids: local block i <- remote block 2i+1 (reversed order), so
// every piece has its own addresses on both sides.
void scattered_ids(std::vector<uint64_t> &local, std::vector<uint64_t> &remote, size_t n) {
    local.clear();
    remote.clear();
    for (size_t i = 0; i < n; ++i) {
        local.push_back(i);
        remote.push_back(2 * (n - 1 - i) + 1);
    }
}

bool block_eq(const std::vector<char> &a, size_t ab, const std::vector<char> &b, size_t bb, size_t g, size_t len) {
    return std::memcmp(a.data() + (g * kBlocks + ab) * kBlock, b.data() + (g * kBlocks + bb) * kBlock, len) == 0;
}

void both_ways(BlockPair &p, size_t len) {
    fill_random(p.tmem, 11);
    std::memset(p.imem.data(), 0x5a, p.imem.size());
    std::vector<uint64_t> local, remote;
    scattered_ids(local, remote, kBlocks / 2);
    auto o = run_blocks(p.init, OPCODE_READ, p.seg, p.regions(len), local, remote);
    REQUIRE_EQ(o.submit, 0);
    CHECK_EQ(o.task, 0u);
    CHECK_EQ(o.submitted, 1u);  // one task for 3 x 32 pieces
    CHECK_EQ(o.st.status, STATUS_COMPLETED);
    CHECK_EQ(o.st.transferred_bytes, kRegions * local.size() * len);
    for (size_t g = 0; g < kRegions; ++g)
        for (size_t i = 0; i < local.size(); ++i) {
            CHECK(block_eq(p.imem, local[i], p.tmem, remote[i], g, len));
            if (len < kBlock) CHECK_EQ(p.imem[(g * kBlocks + local[i]) * kBlock + len], static_cast<char>(0x5a));
        }
    CHECK_EQ(p.imem[(kBlocks - 1) * kBlock], static_cast<char>(0x5a));  // blocks not named stay
    // WRITE back the other way into fresh remote blocks.
    fill_random(p.imem, 12);
    std::vector<char> before = p.tmem;
    o = run_blocks(p.init, OPCODE_WRITE, p.seg, p.regions(len), local, remote);
    REQUIRE_EQ(o.submit, 0);
    CHECK_EQ(o.st.status, STATUS_COMPLETED);
    for (size_t g = 0; g < kRegions; ++g) {
        for (size_t i = 0; i < local.size(); ++i) CHECK(block_eq(p.tmem, remote[i], p.imem, local[i], g, len));
        CHECK(block_eq(p.tmem, 0, before, 0, g, kBlock));  // even blocks are not named
    }
}

}  // namespace

TEST(blocks_over_tcp_both_ways) {
    BlockPair p;
    both_ways(p, kBlock);
    both_ways(p, 1000);  // a block shorter than its stride
    CHECK(counters(p.init).tcp_requests_sent >= 2 * kRegions * kBlocks / 2);
}

TEST(blocks_into_the_local_segment) {
    BlockPair p;
    // The initiator's own memory: region 0 -> region 2 by ids.
    fill_random(p.imem, 5);
    std::vector<char> before = p.imem;
    char *base = p.imem.data();
    std::vector<mc_block_region_t> r{mc_block_region_t{reinterpret_cast<uint64_t>(base),
                                                       reinterpret_cast<uint64_t>(base + 2 * kBlocks * kBlock),
                                                       kBlock, kBlock, kBlock}};
    std::vector<uint64_t> local{0, 5, 9}, remote{3, 1, 60};
    auto o = run_blocks(p.init, OPCODE_WRITE, LOCAL_SEGMENT, r, local, remote);
    REQUIRE_EQ(o.submit, 0);
    CHECK_EQ(o.st.status, STATUS_COMPLETED);
    for (size_t i = 0; i < local.size(); ++i)
        CHECK(std::memcmp(base + (2 * kBlocks + remote[i]) * kBlock, before.data() + local[i] * kBlock, kBlock) == 0);
}

// A piece the target refuses fails the whole task with the target's reason;
// the other pieces still ran, and the engine keeps serving.
TEST(blocks_a_refused_piece_fails_the_task) {
    BlockPair p;
    fill_random(p.tmem, 3);
    std::vector<uint64_t> local{0, 1, 2}, remote{0, 1, 2};
    auto r = p.regions();
    // Region 1's remote blocks moved past the target's buffer.
    r[1].remote_base = reinterpret_cast<uint64_t>(p.tmem.data()) + p.tmem.size();
    auto o = run_blocks(p.init, OPCODE_READ, p.seg, r, local, remote);
    REQUIRE_EQ(o.submit, 0);
    CHECK_EQ(o.st.status, STATUS_FAILED);
    CHECK_EQ(o.st.transferred_bytes, 0u);
    CHECK(!o.error.empty());
    CHECK(block_eq(p.imem, 2, p.tmem, 2, 2, kBlock));  // region 2 arrived
    o = run_blocks(p.init, OPCODE_READ, p.seg, p.regions(), local, remote);
    CHECK_EQ(o.st.status, STATUS_COMPLETED);
}

TEST(blocks_malformed_lists_are_refused_with_their_cause) {
    BlockPair p;
    std::vector<uint64_t> ids{0, 1, 2}, other{3, 4, 5};
    struct Case {
        const char *what;
        std::vector<mc_block_region_t> regions;
        std::vector<uint64_t> local, remote;
        int op;
        int status;
        const char *says;
    };
    auto r = p.regions();
    auto with = [&](auto edit) {
        auto c = p.regions();
        edit(c);
        return c;
    };
    const uint64_t huge = UINT64_MAX / 2;
    std::vector<Case> cases = {
        {"opcode", r, ids, other, 7, MC_STATUS_INVALID_ARGUMENT, "neither READ nor WRITE"},
        {"no regions", {}, ids, other, OPCODE_READ, MC_STATUS_INVALID_ARGUMENT, "0 regions"},
        {"repeated destination", r, {0, 1, 1}, other, OPCODE_READ, MC_STATUS_INVALID_ARGUMENT,
         "local block id 1 appears twice"},
        {"repeated remote destination", r, ids, {4, 4, 5}, OPCODE_WRITE, MC_STATUS_INVALID_ARGUMENT,
         "remote block id 4 appears twice"},
        {"zero length", with([](auto &c) { c[2].block_len = 0; }), ids, other, OPCODE_READ,
         MC_STATUS_INVALID_ARGUMENT, "region 2: block length is zero"},
        {"overlapping destination", with([](auto &c) { c[0].local_stride = 100; }), ids, other, OPCODE_READ,
         MC_STATUS_INVALID_ARGUMENT, "region 0: the local stride 100 is shorter"},
        {"wrapping local", r, {0, huge, 2}, other, OPCODE_READ, MC_STATUS_INVALID_ARGUMENT,
         "local blocks wrap around"},
        {"wrapping remote", r, ids, {0, huge, 1}, OPCODE_READ, MC_STATUS_INVALID_ARGUMENT,
         "remote blocks wrap around"},
        {"unregistered local", with([](auto &c) { c[1].local_base += 1 << 30; }), ids, other, OPCODE_READ,
         MC_STATUS_ADDRESS_NOT_REGISTERED, "region 1: local blocks span"},
        {"local past the buffer", r, {0, 1, kRegions * kBlocks}, other, OPCODE_READ,
         MC_STATUS_ADDRESS_NOT_REGISTERED, "not inside one registered buffer"},
    };
    for (auto &c : cases) {
        batch_id_t b = allocateBatchID(p.init, 2);
        size_t task = 99;
        int rc = mc_submit_blocks(p.init, b, c.op, p.seg, c.regions.data(), c.regions.size(), c.local.data(),
                                  c.remote.data(), c.local.size(), &task);
        std::string msg = mc_last_error_message();
        if (rc != c.status || msg.find(c.says) == std::string::npos)
            std::fprintf(stderr, "case %s: rc %d, message %s\n", c.what, rc, msg.c_str());
        CHECK_EQ(rc, c.status);
        CHECK(msg.find(c.says) != std::string::npos);
        CHECK_EQ(task, 99u);
        size_t n = 7;
        mc_batch_status(p.init, b, nullptr, 0, &n);
        CHECK_EQ(n, 0u);  // the batch is untouched
        CHECK_EQ(freeBatchID(p.init, b), 0);
    }
    // Null arrays, too many pieces, an unknown segment, a full batch.
    batch_id_t b = allocateBatchID(p.init, 1);
    CHECK_EQ(mc_submit_blocks(p.init, b, OPCODE_READ, p.seg, nullptr, 1, ids.data(), other.data(), 3, nullptr),
             MC_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(mc_submit_blocks(p.init, b, OPCODE_READ, p.seg, r.data(), r.size(), ids.data(), other.data(),
                              (1u << 24) / 3 + 1, nullptr),
             MC_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(mc_last_error_message()).find("pieces are allowed") != std::string::npos);
    CHECK_EQ(mc_submit_blocks(p.init, b, OPCODE_READ, 4242, r.data(), r.size(), ids.data(), other.data(), 3, nullptr),
             MC_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(mc_last_error_message()).find("unknown segment id 4242") != std::string::npos);
    CHECK_EQ(mc_submit_blocks(p.init, b, OPCODE_READ, p.seg, r.data(), r.size(), ids.data(), other.data(), 3, nullptr),
             MC_STATUS_OK);
    CHECK_EQ(mc_submit_blocks(p.init, b, OPCODE_READ, p.seg, r.data(), r.size(), ids.data(), other.data(), 3, nullptr),
             MC_STATUS_TOO_MANY_REQUESTS);
    CHECK_EQ(mc_batch_wait(p.init, b, 20000), 0);
    CHECK_EQ(freeBatchID(p.init, b), 0);
    CHECK_EQ(mc_submit_blocks(nullptr, b, OPCODE_READ, p.seg, r.data(), r.size(), ids.data(), other.data(), 3,
                              nullptr),
             MC_STATUS_INVALID_ARGUMENT);
}
