// Batched GPU copies: gpu::copy_many behind the same-host GPU path (one
// stream wait per submission, adjacent pieces merged), and the staged
// batches of small GPU requests over TCP (KV blocks: many descriptors of
// tens of KiB, scattered on one side).
#include <cstring>
#include <random>

#include "common/error.h"
#include "engine_fixture.h"
#include "gpu/gpu.h"
#if MC_WITH_CUDA
#include "gpu/gather_kernel.h"
#endif
#include "gpu_lane.h"
#include "test_util.h"

using namespace mctest;

namespace {
std::vector<char> pattern(size_t n, uint32_t seed) {
    std::vector<char> v(n);
    std::mt19937 g(seed);
    for (auto &c : v) c = static_cast<char>(g());
    return v;
}
}  // namespace

TEST(gpu_copy_many_without_a_gpu) {
    if (mcrs::gpu::status().usable) {
        std::fprintf(stderr, "    SKIPPED: a GPU is usable here; the GPU lane covers it\n");
        return;
    }
    mcrs::gpu::copy_many(nullptr, 0);  // nothing to copy: no error
    char a[8] = {0}, b[8] = {1};
    mcrs::gpu::CopyPiece p{a, -1, b, -1, sizeof a};
    bool threw = false;
    try {
        mcrs::gpu::copy_many(&p, 1);
    } catch (const mcrs::Error &) {
        threw = true;
    }
    CHECK(threw);
}

TEST(gpu_copy_many_scattered_and_adjacent_pieces) {
    if (!gpu_lane("gpu_copy_many_scattered_and_adjacent_pieces")) return;
    const size_t blk = 32768, nblk = 64, n = blk * nblk * 2;
    DeviceBuf src(n), dst(n);
    auto data = pattern(n, 7);
    src.upload(data);
    REQUIRE_EQ(mc_gpu_memset(0, dst.ptr, 0x5A, n), 0);
    // Every other block (scattered), then a run of adjacent blocks that
    // merges into one copy, then an odd-sized unaligned piece.
    std::vector<mcrs::gpu::CopyPiece> pieces;
    for (size_t b = 0; b < nblk; b += 2) pieces.push_back({dst.at(b * blk), 0, src.at(b * blk), 0, blk});
    for (size_t b = nblk; b < nblk + 8; ++b) pieces.push_back({dst.at(b * blk), 0, src.at(b * blk), 0, blk});
    pieces.push_back({dst.at(n - 1001), 0, src.at(n - 1001), 0, 999});
    mcrs::gpu::copy_many(pieces.data(), pieces.size());
    auto got = dst.download(0, n);
    for (const auto &p : pieces) {
        size_t off = static_cast<size_t>(static_cast<char *>(p.dst) - dst.at(0));
        CHECK(std::memcmp(got.data() + off, data.data() + off, p.n) == 0);
    }
    CHECK_EQ(got[blk], static_cast<char>(0x5A));  // block 1 was skipped
    CHECK_EQ(got[n - 1], static_cast<char>(0x5A));
    // Dependent pieces in one call: a chain src -> dst -> dst' -> dst'',
    // and a piece that overwrites what an earlier one read. Copies of one
    // batched runtime call may run in any order, so these must be split.
    {
        REQUIRE_EQ(mc_gpu_memset(0, dst.ptr, 0, n), 0);
        std::vector<mcrs::gpu::CopyPiece> chain = {{dst.at(0), 0, src.at(0), 0, blk},
                                                   {dst.at(4 * blk), 0, dst.at(0), 0, blk},
                                                   {dst.at(8 * blk), 0, dst.at(4 * blk), 0, blk},
                                                   {dst.at(12 * blk), 0, src.at(blk), 0, blk},
                                                   {src.at(blk), 0, src.at(2 * blk), 0, blk}};
        mcrs::gpu::copy_many(chain.data(), chain.size());
        auto got2 = dst.download(0, 13 * blk);
        for (size_t at : {size_t(0), 4 * blk, 8 * blk})
            CHECK(std::memcmp(got2.data() + at, data.data(), blk) == 0);
        CHECK(std::memcmp(got2.data() + 12 * blk, data.data() + blk, blk) == 0);  // read before overwritten
        CHECK(src.download(blk, blk) == std::vector<char>(data.begin() + 2 * blk, data.begin() + 3 * blk));
        src.upload(data);
    }
    // Device -> host and host -> device pieces in one batch.
    std::vector<char> host(2 * blk, 0);
    std::vector<mcrs::gpu::CopyPiece> mixed = {{host.data(), -1, src.at(0), 0, blk},
                                               {dst.at(blk), 0, data.data() + 3 * blk, -1, blk}};
    mcrs::gpu::copy_many(mixed.data(), mixed.size());
    CHECK(std::memcmp(host.data(), data.data(), blk) == 0);
    CHECK(dst.download(blk, blk) == std::vector<char>(data.begin() + 3 * blk, data.begin() + 4 * blk));
}

// Pieces the gather kernel takes (16-byte aligned, up to 1 MiB) mixed with
// ones it leaves to the copy calls (unaligned, odd lengths, over 1 MiB),
// more pieces than the kernel has blocks (it strides), and a second larger
// batch that grows its piece table: every piece lands, every gap keeps its
// poison.
TEST(gpu_gather_kernel_mixed_pieces) {
    if (!gpu_lane("gpu_gather_kernel_mixed_pieces")) return;
    const size_t n = 96u << 20;
    DeviceBuf src(n), dst(n);
    auto data = pattern(n, 11);
    src.upload(data);
    for (size_t round = 0; round < 2; ++round) {
        REQUIRE_EQ(mc_gpu_memset(0, dst.ptr, 0x5A, n), 0);
        std::vector<mcrs::gpu::CopyPiece> pieces;
        size_t at = 0;
        auto piece = [&](size_t len, size_t gap) {
            pieces.push_back({dst.at(at), 0, src.at(at), 0, len});
            at += len + gap;
        };
        // Many tiny pieces: more than the kernel's 16,384 blocks; round 2
        // outgrows the piece table of round 1.
        const size_t tiny = round == 0 ? 20000 : 60000;
        for (size_t i = 0; i < tiny; ++i) piece(16, 16);
        for (size_t i = 0; i < 300; ++i) piece(4096, 4096);
        for (size_t i = 0; i < 40; ++i) piece(32768 + 16 * i, 48);
        piece(1u << 20, 16);               // the largest the kernel takes
        piece((1u << 20) + 16, 16);        // one step over: a copy call
        piece(999, 1);                     // odd length
        at += 3;                           // unaligned on both sides
        piece(4096, 13);
        piece(8u << 20, 64);               // large
        REQUIRE(at <= n);
        mcrs::gpu::copy_many(pieces.data(), pieces.size());
        auto got = dst.download(0, n);
        size_t end = 0;
        bool bytes_ok = true, gaps_ok = true;
        for (const auto &p : pieces) {
            const size_t off = static_cast<size_t>(static_cast<char *>(p.dst) - dst.at(0));
            for (size_t g = end; g < off; ++g) gaps_ok = gaps_ok && got[g] == static_cast<char>(0x5A);
            bytes_ok = bytes_ok && std::memcmp(got.data() + off, data.data() + off, p.n) == 0;
            end = off + p.n;
        }
        CHECK(bytes_ok);
        CHECK(gaps_ok);
        CHECK_EQ(got[end], static_cast<char>(0x5A));
    }
}

#if MC_WITH_CUDA

// The driver compiles and runs the gather kernel itself (a PTX it refused
// would leave copy_many correct but one copy at a time, so the test above
// cannot tell): pieces from 16 bytes to 1 MiB, shorter and longer than one
// step of a block's threads; every byte lands and every gap keeps its
// poison.
TEST(gpu_gather_kernel_loads_and_copies) {
    if (!gpu_lane("gpu_gather_kernel_loads_and_copies")) return;
    const size_t n = 8u << 20;
    DeviceBuf src(n), dst(n);
    auto data = pattern(n, 5);
    src.upload(data);
    REQUIRE_EQ(mc_gpu_memset(0, dst.ptr, 0x5A, n), 0);
    std::vector<void *> d;
    std::vector<const void *> s;
    std::vector<size_t> l;
    size_t at = 0;
    const size_t lens[] = {16, 496, 512, 528, 1536, 2048, 2064, 4096, 32768, 32784, 65552, 73728, 1u << 20};
    for (size_t rep = 0; rep < 3; ++rep)
        for (size_t len : lens) {
            d.push_back(dst.at(at));
            s.push_back(src.at(at));
            l.push_back(len);
            at += len + 16;
        }
    REQUIRE(at <= n);
    cudaStream_t st = nullptr;
    REQUIRE_EQ(int(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)), int(cudaSuccess));
    CHECK_EQ(int(mcrs::gpu::launch_gather(st, 0, d.data(), s.data(), l.data(), d.size())), int(cudaSuccess));
    CHECK_EQ(int(cudaStreamSynchronize(st)), int(cudaSuccess));
    cudaStreamDestroy(st);
    auto got = dst.download(0, n);
    size_t end = 0;
    bool bytes_ok = true, gaps_ok = true;
    for (size_t i = 0; i < d.size(); ++i) {
        const size_t off = static_cast<size_t>(static_cast<char *>(d[i]) - dst.at(0));
        for (size_t g = end; g < off; ++g) gaps_ok = gaps_ok && got[g] == static_cast<char>(0x5A);
        bytes_ok = bytes_ok && std::memcmp(got.data() + off, data.data() + off, l[i]) == 0;
        end = off + l[i];
    }
    CHECK(bytes_ok);
    CHECK(gaps_ok);
    CHECK_EQ(got[end], static_cast<char>(0x5A));
}

// The block-list kernel (gpu::copy_blocks): two regions of 32 KiB blocks
// with their own strides, ids scattered and reversed; every named block
// lands, every other byte keeps its poison. Then unaligned blocks, which
// take the piece-by-piece path, with the same check.
TEST(gpu_block_kernel_copies_named_blocks) {
    if (!gpu_lane("gpu_block_kernel_copies_named_blocks")) return;
    const size_t n = 32u << 20, blk = 32768;
    DeviceBuf src(n), dst(n);
    auto data = pattern(n, 9);
    src.upload(data);
    for (size_t len : {blk, size_t{1000}}) {
        REQUIRE_EQ(mc_gpu_memset(0, dst.ptr, 0x5A, n), 0);
        // Region 0: dst stride 2 blocks, src stride 1 (dst ids up to 298:
        // 19.1 MiB); region 1 from 20 MiB (dst) and 4 MiB (src) on.
        std::vector<mcrs::gpu::BlockCopyRegion> r = {
            {reinterpret_cast<uint64_t>(dst.at(0)), reinterpret_cast<uint64_t>(src.at(0)), 2 * blk, blk, len, 0, 0},
            {reinterpret_cast<uint64_t>(dst.at(20u << 20)), reinterpret_cast<uint64_t>(src.at(4u << 20)), blk, blk,
             len, 0, 0}};
        std::vector<uint64_t> dst_ids, src_ids;
        for (uint64_t i = 0; i < 100; ++i) {
            dst_ids.push_back(3 * i + 1);
            src_ids.push_back(99 - i);
        }
        mcrs::gpu::copy_blocks(r.data(), r.size(), dst_ids.data(), src_ids.data(), dst_ids.size());
        auto got = dst.download(0, n);
        std::vector<char> expect(n, 0x5A);
        for (const auto &g : r)
            for (size_t i = 0; i < dst_ids.size(); ++i)
                std::memcpy(expect.data() + (g.dst - reinterpret_cast<uint64_t>(dst.at(0))) + dst_ids[i] * g.dst_stride,
                            data.data() + (g.src - reinterpret_cast<uint64_t>(src.at(0))) + src_ids[i] * g.src_stride,
                            len);
        CHECK(got == expect);
    }
}

#endif

TEST(gpu_scattered_blocks_over_tcp_in_staged_batches) {
    if (!gpu_lane("gpu_scattered_blocks_over_tcp_in_staged_batches")) return;
    // Two engines in one process (same pid: TCP, never IPC). One batch
    // mixes small GPU WRITEs (staged in batches on both sides), requests
    // larger than a staging piece (the chunked path), odd sizes and
    // host-memory WRITEs, all interleaved; every byte is checked and the
    // untouched gaps must keep their poison.
    transfer_engine_t target = make_engine();
    transfer_engine_t init = make_engine();
    REQUIRE(target && init);
    const size_t blk = 32768, n = 64u << 20;
    DeviceBuf tg(n), ig(n);
    std::vector<char> th(n, 0);
    REQUIRE_EQ(registerLocalMemory(target, tg.ptr, n, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(target, th.data(), n, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(init, ig.ptr, n, "*", 1), 0);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    REQUIRE(seg > 0);
    const uint64_t tga = reinterpret_cast<uint64_t>(tg.ptr), tha = reinterpret_cast<uint64_t>(th.data());
    auto src = pattern(n / 2, 11);
    ig.upload(src);
    struct Piece {
        size_t src_off, dst_off, len;
        bool host;
    };
    std::vector<Piece> plan;
    size_t s_off = 0;
    // 700 blocks to every other destination block (several staging halves),
    // with odd sizes, a large request and host targets mixed in.
    for (size_t b = 0; b < 700; ++b) {
        size_t len = blk;
        if (b % 97 == 5) len = 1;
        if (b % 89 == 7) len = 4097;
        if (b == 300) len = (3u << 20) + 5;  // larger than a staging piece
        plan.push_back({s_off, 2 * s_off + blk, len, b % 50 == 9});
        s_off += len;
    }
    REQUIRE(2 * s_off + blk <= n && s_off <= n / 2);
    std::vector<transfer_request> w;
    for (const auto &p : plan)
        w.push_back(transfer_request{OPCODE_WRITE, ig.at(p.src_off), seg, (p.host ? tha : tga) + p.dst_off, p.len});
    REQUIRE_EQ(mc_gpu_memset(0, tg.ptr, 0x5A, n), 0);
    auto st = run_batch(init, w, 60000);
    REQUIRE_EQ(st.size(), w.size());
    for (size_t i = 0; i < st.size(); ++i) CHECK_EQ(st[i], STATUS_COMPLETED);
    auto got = tg.download(0, n);
    for (const auto &p : plan) {
        const char *have = p.host ? th.data() + p.dst_off : got.data() + p.dst_off;
        CHECK(std::memcmp(have, src.data() + p.src_off, p.len) == 0);
        if (!p.host) CHECK_EQ(got[p.dst_off - 1], static_cast<char>(0x5A));  // the gap before it
    }
    // READ them back into a poisoned local buffer: small GPU READs through
    // the staged path of the target's sends.
    REQUIRE_EQ(mc_gpu_memset(0, ig.ptr, 0x33, n), 0);
    std::vector<transfer_request> r;
    for (const auto &p : plan)
        r.push_back(transfer_request{OPCODE_READ, ig.at(p.src_off), seg, (p.host ? tha : tga) + p.dst_off, p.len});
    st = run_batch(init, r, 60000);
    for (size_t i = 0; i < st.size(); ++i) CHECK_EQ(st[i], STATUS_COMPLETED);
    CHECK(ig.download(0, s_off) == std::vector<char>(src.begin(), src.begin() + static_cast<long>(s_off)));
    CHECK_EQ(ig.download(s_off, 1)[0], static_cast<char>(0x33));
    mc_engine_counters_t c{};
    mc_engine_get_counters(init, &c);
    CHECK_EQ(c.ipc_copies, 0u);
    destroyTransferEngine(init);
    destroyTransferEngine(target);
}
