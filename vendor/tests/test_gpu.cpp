// GPU memory end to end. On a machine without a GPU these check that GPU
// calls fail cleanly; the GPU lane runs with MOONCAKE_GPU_TESTS=1 (and then
// fails for real if no GPU is usable).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "engine/transfer_engine.h"
#include "engine_fixture.h"
#include "gpu/gpu.h"
#include "gpu_lane.h"
#include "transport/ipc/ipc_transport.h"

extern char **environ;

using namespace mctest;

namespace {

std::vector<char> random_bytes(size_t n, uint32_t seed) {
    std::vector<char> v(n);
    std::mt19937_64 g(seed);
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t x = g();
        std::memcpy(&v[i], &x, 8);
    }
    for (size_t i = n & ~size_t(7); i < n; ++i) v[i] = static_cast<char>(g());
    return v;
}

int one_transfer(transfer_engine_t e, int op, void *local, segment_id_t seg, uint64_t remote, size_t len) {
    auto st = run_batch(e, {transfer_request{op, local, seg, remote, len}}, 60000);
    return st.empty() ? -1 : st[0];
}

const size_t kSizes[] = {4096, 65536 + 13, (1u << 20) + 7, 16u << 20, 64u << 20};
// Two GPUs: 4 KiB to 1 GiB.
const size_t kPairSizes[] = {4096, 65536 + 13, (1u << 20) + 7, 16u << 20, 64u << 20, 256u << 20, 1u << 30};

}  // namespace

TEST(gpu_calls_fail_cleanly_without_a_gpu) {
    std::string why;
    mc_gpu_info_t info = gpu_info(&why);
    if (info.usable) {
        mctest::record_skip("a GPU is usable here; the GPU lane covers it");
        return;
    }
    CHECK(!why.empty());
    if (info.build_cuda_major == 0) CHECK(why.find("without CUDA") != std::string::npos);
    else CHECK(why.find("built for CUDA " + std::to_string(info.build_cuda_major)) != std::string::npos);
    void *p = nullptr;
    CHECK(mc_gpu_alloc(0, 4096, &p) != 0);
    CHECK(std::string(mc_last_error_message()).find("GPU memory is not available") != std::string::npos);
    mc_dmabuf_t d;
    char host[64];
    CHECK(mc_gpu_dmabuf_export(host, sizeof host, &d) != 0);
    int32_t dev = 7;
    CHECK_EQ(mc_gpu_pointer_device(host, &dev), 0);
    CHECK_EQ(dev, -1);
    // Host memory still works in an engine with CUDA compiled in.
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    std::vector<char> a(8192, 1), b(8192, 2);
    REQUIRE_EQ(registerLocalMemory(e, a.data(), a.size(), "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, b.data(), b.size(), "*", 1), 0);
    CHECK_EQ(one_transfer(e, OPCODE_READ, b.data(), LOCAL_SEGMENT, reinterpret_cast<uint64_t>(a.data()), 8192),
             STATUS_COMPLETED);
    CHECK(a == b);
    destroyTransferEngine(e);
}

TEST(gpu_pointer_classification_and_registration) {
    if (!gpu_lane("gpu_pointer_classification_and_registration")) return;
    DeviceBuf d(1 << 20);
    int32_t dev = -5;
    CHECK_EQ(mc_gpu_pointer_device(d.at(100), &dev), 0);
    CHECK_EQ(dev, 0);
    std::vector<char> h(64);
    CHECK_EQ(mc_gpu_pointer_device(h.data(), &dev), 0);
    CHECK_EQ(dev, -1);
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    REQUIRE_EQ(registerLocalMemory(e, d.ptr, d.len, "*", 1), 0);
    // Past the end of the allocation: refused with the reason.
    CHECK_EQ(registerLocalMemory(e, d.at(4096), d.len, "*", 1), ERR_INVALID_ARGUMENT);
    CHECK(std::string(mc_last_error_message()).find("past the end of its allocation") != std::string::npos);
    transfer_engine_t peer = make_engine();
    segment_id_t seg = openSegment(peer, segment_name(e).c_str());
    REQUIRE(seg > 0);
    mc_buffer_info_t info[2];
    size_t n = 0;
    mc_segment_buffers(peer, seg, info, 2, &n);
    CHECK_EQ(n, 1u);
    destroyTransferEngine(peer);
    destroyTransferEngine(e);
}

TEST(gpu_local_host_and_device_copies) {
    if (!gpu_lane("gpu_local_host_and_device_copies")) return;
    const size_t max = 64u << 20;
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    DeviceBuf d0(max), d1(max);
    std::vector<char> host(max);
    REQUIRE_EQ(registerLocalMemory(e, d0.ptr, max, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, d1.ptr, max, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, host.data(), max, "*", 1), 0);
    for (size_t sz : kSizes) {
        auto data = random_bytes(sz, static_cast<uint32_t>(sz));
        d0.upload(data);
        // GPU -> GPU.
        REQUIRE_EQ(mc_gpu_memset(0, d1.ptr, 0x5A, max), 0);
        CHECK_EQ(one_transfer(e, OPCODE_READ, d1.ptr, LOCAL_SEGMENT, reinterpret_cast<uint64_t>(d0.ptr), sz), STATUS_COMPLETED);
        CHECK(d1.download(0, sz) == data);
        if (sz < max) CHECK_EQ(d1.download(sz, 1)[0], static_cast<char>(0x5A));
        // GPU -> host and host -> GPU.
        std::memset(host.data(), 0x33, std::min(sz + 1, max));
        CHECK_EQ(one_transfer(e, OPCODE_READ, host.data(), LOCAL_SEGMENT, reinterpret_cast<uint64_t>(d0.ptr), sz), STATUS_COMPLETED);
        CHECK(std::memcmp(host.data(), data.data(), sz) == 0);
        if (sz < max) CHECK_EQ(host[sz], static_cast<char>(0x33));
        auto back = random_bytes(sz, static_cast<uint32_t>(sz) + 1);
        std::memcpy(host.data(), back.data(), sz);
        REQUIRE_EQ(mc_gpu_memset(0, d1.ptr, 0, max), 0);
        CHECK_EQ(one_transfer(e, OPCODE_WRITE, host.data(), LOCAL_SEGMENT, reinterpret_cast<uint64_t>(d1.ptr), sz), STATUS_COMPLETED);
        CHECK(d1.download(0, sz) == back);
    }
    mc_engine_counters_t c{};
    mc_engine_get_counters(e, &c);
    CHECK_EQ(c.local_copies, 3 * (sizeof kSizes / sizeof kSizes[0]));
    destroyTransferEngine(e);
}

TEST(gpu_buffers_over_tcp_both_ways) {
    if (!gpu_lane("gpu_buffers_over_tcp_both_ways")) return;
    // Two engines in one process: same pid, so never the IPC path.
    transfer_engine_t target = make_engine();
    transfer_engine_t init = make_engine();
    REQUIRE(target && init);
    const size_t max = 64u << 20;
    DeviceBuf tg(max), ig(max);
    std::vector<char> ih(max), th(max);
    REQUIRE_EQ(registerLocalMemory(target, tg.ptr, max, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(target, th.data(), max, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(init, ig.ptr, max, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(init, ih.data(), max, "*", 1), 0);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    REQUIRE(seg > 0);
    uint64_t tga = reinterpret_cast<uint64_t>(tg.ptr), tha = reinterpret_cast<uint64_t>(th.data());
    for (size_t sz : kSizes) {
        auto data = random_bytes(sz, 100 + static_cast<uint32_t>(sz));
        tg.upload(data);
        // READ: remote GPU -> local GPU, remote GPU -> local host.
        REQUIRE_EQ(mc_gpu_memset(0, ig.ptr, 0x77, max), 0);
        CHECK_EQ(one_transfer(init, OPCODE_READ, ig.ptr, seg, tga, sz), STATUS_COMPLETED);
        CHECK(ig.download(0, sz) == data);
        if (sz < max) CHECK_EQ(ig.download(sz, 1)[0], static_cast<char>(0x77));
        std::memset(ih.data(), 0, sz);
        CHECK_EQ(one_transfer(init, OPCODE_READ, ih.data(), seg, tga, sz), STATUS_COMPLETED);
        CHECK(std::memcmp(ih.data(), data.data(), sz) == 0);
        // WRITE: local GPU -> remote GPU, local GPU -> remote host.
        auto w = random_bytes(sz, 200 + static_cast<uint32_t>(sz));
        ig.upload(w);
        REQUIRE_EQ(mc_gpu_memset(0, tg.ptr, 0, max), 0);
        CHECK_EQ(one_transfer(init, OPCODE_WRITE, ig.ptr, seg, tga, sz), STATUS_COMPLETED);
        CHECK(tg.download(0, sz) == w);
        std::memset(th.data(), 0, sz);
        CHECK_EQ(one_transfer(init, OPCODE_WRITE, ig.ptr, seg, tha, sz), STATUS_COMPLETED);
        CHECK(std::memcmp(th.data(), w.data(), sz) == 0);
    }
    // Out of range on the GPU buffer: rejected like host memory.
    CHECK_EQ(one_transfer(init, OPCODE_READ, ig.ptr, seg, tga + max - 8, 16), STATUS_FAILED);
    mc_engine_counters_t c{};
    mc_engine_get_counters(init, &c);
    CHECK_EQ(c.ipc_copies, 0u);
    CHECK(c.tcp_requests_sent >= 4 * (sizeof kSizes / sizeof kSizes[0]));
    destroyTransferEngine(init);
    destroyTransferEngine(target);
}

// The peer process for the two-process test: a GPU buffer filled with
// random_bytes(size, seed), then commands on stdin.
int gpu_peer_main(int argc, char **argv) {
    if (argc < 4) return 2;
    size_t size = std::strtoull(argv[2], nullptr, 10);
    uint32_t seed = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
    int device = argc > 4 ? std::atoi(argv[4]) : 0;
    transfer_engine_t e = make_engine();
    if (!e) return 1;
    void *d = nullptr;
    if (mc_gpu_alloc(device, size, &d) != 0) {
        std::printf("FAILED %s\n", mc_last_error_message());
        return 1;
    }
    auto data = random_bytes(size, seed);
    mc_gpu_memcpy(d, data.data(), size);
    if (registerLocalMemory(e, d, size, "*", 1) != 0) return 1;
    // The allocation's IPC handle too, for tests that forge a descriptor.
    mcrs::gpu::IpcExport x;
    std::string err;
    if (!mcrs::gpu::ipc_export(d, x, err)) x.handle_hex = "-";
    std::printf("READY %s %llu %s\n", segment_name(e).c_str(),
                static_cast<unsigned long long>(reinterpret_cast<uint64_t>(d)), x.handle_hex.c_str());
    std::fflush(stdout);
    char line[256];
    while (std::fgets(line, sizeof line, stdin)) {
        unsigned long long off = 0, len = 0, s = 0;
        if (std::sscanf(line, "check %llu %llu %llu", &off, &len, &s) == 3) {
            std::vector<char> got(len);
            mc_gpu_memcpy(got.data(), static_cast<char *>(d) + off, len);
            std::printf(got == random_bytes(len, static_cast<uint32_t>(s)) ? "OK\n" : "BAD\n");
            std::fflush(stdout);
        } else {
            break;
        }
    }
    destroyTransferEngine(e);
    mc_gpu_free(device, d);
    return 0;
}

namespace {

// A peer process (this binary, --gpu-peer) with a GPU buffer of `max`
// bytes on `device` filled with random_bytes(max, 4242); it checks ranges
// of its buffer on request and exits on `quit`.
struct GpuPeer {
    pid_t pid = 0;
    FILE *in = nullptr, *out = nullptr;
    std::string segment;
    uint64_t remote = 0;
    std::string ipc_handle;  // of the peer's allocation, "-" if it has none

    GpuPeer(size_t max, int device) {
        int to_child[2], from_child[2];
        REQUIRE(pipe(to_child) == 0 && pipe(from_child) == 0);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
        posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
        posix_spawn_file_actions_addclose(&fa, to_child[1]);
        posix_spawn_file_actions_addclose(&fa, from_child[0]);
        std::string size_s = std::to_string(max), dev_s = std::to_string(device);
        char *args[] = {const_cast<char *>("engine_tests"), const_cast<char *>("--gpu-peer"), &size_s[0],
                        const_cast<char *>("4242"), &dev_s[0], nullptr};
        REQUIRE(posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, args, environ) == 0);
        posix_spawn_file_actions_destroy(&fa);
        close(to_child[0]);
        close(from_child[1]);
        in = fdopen(from_child[0], "r");
        out = fdopen(to_child[1], "w");
        char line[512] = {0};
        REQUIRE(std::fgets(line, sizeof line, in) != nullptr);
        char seg_name[256], handle[160];
        unsigned long long addr = 0;
        REQUIRE(std::sscanf(line, "READY %255s %llu %159s", seg_name, &addr, handle) == 3);
        segment = seg_name;
        remote = addr;
        ipc_handle = handle;
    }
    // Whether the peer's bytes [off, off+len) are random_bytes(len, seed).
    bool holds(size_t off, size_t len, uint32_t seed) {
        std::fprintf(out, "check %zu %zu %u\n", off, len, seed);
        std::fflush(out);
        char line[64] = {0};
        return std::fgets(line, sizeof line, in) != nullptr && std::string(line) == "OK\n";
    }
    ~GpuPeer() {
        std::fprintf(out, "quit\n");
        std::fflush(out);
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        fclose(in);
        fclose(out);
    }
};

// A peer process with a GPU buffer of `max` bytes on `peer_device`, read
// and written over the same-host path from a buffer on `my_device`.
template <size_t N>
void two_process_ipc(int peer_device, int my_device, size_t max, const size_t (&sizes)[N]) {
    GpuPeer peer(max, peer_device);
    const uint64_t remote = peer.remote;
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    DeviceBuf mine(max, my_device);
    REQUIRE_EQ(registerLocalMemory(e, mine.ptr, max, "*", 1), 0);
    segment_id_t seg = openSegment(e, peer.segment.c_str());
    REQUIRE(seg > 0);
    auto expect = random_bytes(max, 4242);
    for (size_t sz : sizes) {
        REQUIRE_EQ(mc_gpu_memset(my_device, mine.ptr, 0x11, max), 0);
        CHECK_EQ(one_transfer(e, OPCODE_READ, mine.ptr, seg, remote, sz), STATUS_COMPLETED);
        auto got = mine.download(0, sz);
        CHECK(std::memcmp(got.data(), expect.data(), sz) == 0);
        if (sz < max) CHECK_EQ(mine.download(sz, 1)[0], static_cast<char>(0x11));
    }
    // WRITE into the peer's GPU memory, checked by the peer itself.
    auto w = random_bytes(16u << 20, 777);
    mine.upload(w);
    CHECK_EQ(one_transfer(e, OPCODE_WRITE, mine.ptr, seg, remote + 4096, w.size()), STATUS_COMPLETED);
    CHECK(peer.holds(4096, w.size(), 777));
    mc_engine_counters_t c{};
    mc_engine_get_counters(e, &c);
    CHECK_EQ(c.ipc_copies, N + 1);
    CHECK_EQ(c.tcp_requests_sent, 0u);
    // Out of the advertised buffer: refused before any copy.
    CHECK_EQ(one_transfer(e, OPCODE_READ, mine.ptr, seg, remote + max - 8, 16), STATUS_FAILED);
    destroyTransferEngine(e);
}

// Every other 32 KiB block of the first `blocks`, as one batch.
std::vector<transfer_request> scattered(int op, char *local, segment_id_t seg, uint64_t remote, size_t blocks) {
    const size_t blk = 32768;
    std::vector<transfer_request> r;
    for (size_t b = 0; b < blocks; b += 2) r.push_back(transfer_request{op, local + b * blk, seg, remote + b * blk, blk});
    return r;
}

}  // namespace

TEST(gpu_two_processes_same_gpu_use_cuda_ipc) {
    if (!gpu_lane("gpu_two_processes_same_gpu_use_cuda_ipc")) return;
    two_process_ipc(0, 0, 64u << 20, kSizes);
}

// Two engines of one process (one per TP rank) pull from the same peer
// allocation at once, each with a scattered first batch that its IPC
// workers map concurrently: the process maps the allocation once, both
// engines copy every block through it (no TCP), and the mapping outlives
// the first engine that lets go of it.
TEST(gpu_two_engines_one_process_share_a_peer_mapping) {
    if (!gpu_lane("gpu_two_engines_one_process_share_a_peer_mapping")) return;
    const size_t max = 64u << 20, blocks = 2048, blk = 32768;
    GpuPeer peer(max, 0);
    transfer_engine_t e[2] = {make_engine(), make_engine()};
    REQUIRE(e[0] && e[1]);
    DeviceBuf mine0(max, 0), mine1(max, 0);
    DeviceBuf *mine[2] = {&mine0, &mine1};
    segment_id_t seg[2];
    for (int k = 0; k < 2; ++k) {
        REQUIRE_EQ(registerLocalMemory(e[k], mine[k]->ptr, max, "*", 1), 0);
        REQUIRE_EQ(mc_gpu_memset(0, mine[k]->ptr, 0x11, max), 0);
        seg[k] = openSegment(e[k], peer.segment.c_str());
        REQUIRE(seg[k] > 0);
    }
    std::vector<int> st[2];
    std::thread t1([&] { st[1] = run_batch(e[1], scattered(OPCODE_READ, mine1.at(0), seg[1], peer.remote, blocks), 60000); });
    st[0] = run_batch(e[0], scattered(OPCODE_READ, mine0.at(0), seg[0], peer.remote, blocks), 60000);
    t1.join();
    auto expect = random_bytes(max, 4242);
    for (int k = 0; k < 2; ++k) {
        REQUIRE_EQ(st[k].size(), blocks / 2);
        CHECK(std::all_of(st[k].begin(), st[k].end(), [](int s) { return s == STATUS_COMPLETED; }));
        auto got = mine[k]->download(0, blocks * blk);
        for (size_t b = 0; b < blocks; ++b) {
            if (b % 2 == 0) CHECK(std::memcmp(got.data() + b * blk, expect.data() + b * blk, blk) == 0);
            else CHECK_EQ(got[b * blk], static_cast<char>(0x11));
        }
        mc_engine_counters_t c{};
        mc_engine_get_counters(e[k], &c);
        CHECK_EQ(c.ipc_copies, blocks / 2);
        CHECK_EQ(c.tcp_requests_sent, 0u);
    }
    // The first engine goes; the second still writes through the mapping.
    destroyTransferEngine(e[0]);
    auto w = random_bytes(blocks * blk, 99);
    mine1.upload(w);
    auto ws = run_batch(e[1], scattered(OPCODE_WRITE, mine1.at(0), seg[1], peer.remote, blocks), 60000);
    CHECK(std::all_of(ws.begin(), ws.end(), [](int s) { return s == STATUS_COMPLETED; }));
    REQUIRE_EQ(mc_gpu_memset(0, mine1.ptr, 0x22, max), 0);
    auto rs = run_batch(e[1], scattered(OPCODE_READ, mine1.at(0), seg[1], peer.remote, blocks), 60000);
    CHECK(std::all_of(rs.begin(), rs.end(), [](int s) { return s == STATUS_COMPLETED; }));
    auto back = mine1.download(0, blocks * blk);
    for (size_t b = 0; b < blocks; b += 2) CHECK(std::memcmp(back.data() + b * blk, w.data() + b * blk, blk) == 0);
    mine1.upload(random_bytes(blk, 5));
    CHECK_EQ(one_transfer(e[1], OPCODE_WRITE, mine1.ptr, seg[1], peer.remote + 2 * blk, blk), STATUS_COMPLETED);
    CHECK(peer.holds(2 * blk, blk, 5));
    mc_engine_counters_t c{};
    mc_engine_get_counters(e[1], &c);
    CHECK_EQ(c.tcp_requests_sent, 0u);
    destroyTransferEngine(e[1]);
}

// Block lists through CUDA IPC: the first list finds the peer's allocation
// unmapped and goes the per-request way (which maps it), the next ones are
// one kernel launch each; both move every named block and nothing else, as
// one task, with no TCP. A list reaching past the published buffer fails.
TEST(gpu_block_lists_through_cuda_ipc) {
    if (!gpu_lane("gpu_block_lists_through_cuda_ipc")) return;
    const size_t max = 64u << 20, blk = 32768, per_region = 512, regions = 4;
    GpuPeer peer(max, 0);
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    DeviceBuf mine(max, 0);
    REQUIRE_EQ(registerLocalMemory(e, mine.ptr, max, "*", 1), 0);
    segment_id_t seg = openSegment(e, peer.segment.c_str());
    REQUIRE(seg > 0);
    const size_t region_bytes = per_region * blk;
    std::vector<mc_block_region_t> r;
    for (size_t g = 0; g < regions; ++g)
        r.push_back(mc_block_region_t{reinterpret_cast<uint64_t>(mine.at(g * region_bytes)), peer.remote + g * region_bytes,
                                      blk, blk, blk});
    std::vector<uint64_t> local, remote;  // every other block, reversed
    for (size_t i = 0; i < per_region / 2; ++i) {
        local.push_back(i);
        remote.push_back(per_region - 1 - 2 * i);
    }
    auto run = [&](int op, const std::vector<mc_block_region_t> &rr) {
        batch_id_t b = allocateBatchID(e, 1);
        size_t task = 9;
        int rc = mc_submit_blocks(e, b, op, seg, rr.data(), rr.size(), local.data(), remote.data(), local.size(), &task);
        if (rc != 0) std::fprintf(stderr, "mc_submit_blocks: %s\n", mc_last_error_message());
        CHECK_EQ(rc, 0);
        CHECK_EQ(task, 0u);
        CHECK_EQ(mc_batch_wait(e, b, 60000), 0);
        transfer_status st{};
        getTransferStatus(e, b, 0, &st);
        freeBatchID(e, b);
        return st;
    };
    auto expect = random_bytes(max, 4242);
    for (int round = 0; round < 2; ++round) {
        REQUIRE_EQ(mc_gpu_memset(0, mine.ptr, 0x11, max), 0);
        auto st = run(OPCODE_READ, r);
        CHECK_EQ(st.status, STATUS_COMPLETED);
        CHECK_EQ(st.transferred_bytes, regions * local.size() * blk);
        auto got = mine.download(0, regions * region_bytes);
        bool ok = true;
        for (size_t g = 0; g < regions; ++g)
            for (size_t i = 0; i < per_region; ++i) {
                const char *at = got.data() + g * region_bytes + i * blk;
                if (i < local.size())
                    ok = ok && std::memcmp(at, expect.data() + g * region_bytes + remote[i] * blk, blk) == 0;
                else
                    ok = ok && at[0] == 0x11 && at[blk - 1] == 0x11;
            }
        CHECK(ok);
    }
    // WRITE: our blocks into the peer's odd blocks, checked by the peer.
    auto w = random_bytes(blk, 55);
    for (size_t g = 0; g < regions; ++g)
        for (size_t i = 0; i < local.size(); ++i) mine.upload(w, g * region_bytes + i * blk);
    CHECK_EQ(run(OPCODE_WRITE, r).status, STATUS_COMPLETED);
    for (size_t g = 0; g < regions; ++g) CHECK(peer.holds(g * region_bytes + remote[0] * blk, blk, 55));
    mc_engine_counters_t c{};
    mc_engine_get_counters(e, &c);
    CHECK_EQ(c.ipc_copies, 3 * regions * local.size());
    CHECK_EQ(c.tcp_requests_sent, 0u);
    // Past the published buffer: the span is in no IPC buffer, so the pieces
    // go the per-request way, where the owner refuses them.
    auto past = r;
    past[regions - 1].remote_base = peer.remote + max - blk;
    CHECK_EQ(run(OPCODE_READ, past).status, STATUS_FAILED);
    destroyTransferEngine(e);
}

// A hostile same-host peer publishes its real IPC handle with a forged
// mc_cuda_ipc_offset: copying there would read or write whatever this
// process has mapped past the peer's allocation. Each forged request fails
// with the reason, none falls back or touches memory, and the mapping keeps
// serving honest requests.
TEST(gpu_ipc_refuses_a_forged_offset_past_the_mapped_allocation) {
    if (!gpu_lane("gpu_ipc_refuses_a_forged_offset_past_the_mapped_allocation")) return;
    const size_t max = 4u << 20;  // a whole number of 2 MiB pages: mapped exactly
    GpuPeer peer(max, 0);
    REQUIRE(peer.ipc_handle != "-");
    mcrs::IpcTransport ipc(1);
    std::vector<char> host(max, 0x5a);
    bool fell_back = false;
    auto one = [&](uint64_t ipc_offset, int opcode, uint64_t at, uint64_t len, std::string &why) {
        auto batch = std::make_shared<mcrs::Batch>(1, 1);
        auto first = batch->reserve(1);
        REQUIRE(first.has_value());
        std::vector<mcrs::TransferItem> items(1);
        items[0].batch = batch;
        items[0].task = *first;
        items[0].opcode = opcode;
        items[0].local = host.data() + at;
        items[0].remote_addr = peer.remote + at;
        items[0].length = len;
        auto desc = std::make_shared<mcrs::SegmentDesc>();
        mcrs::BufferDesc b;
        b.addr = peer.remote;
        b.length = max;
        b.cuda_ipc = peer.ipc_handle;
        b.cuda_ipc_offset = ipc_offset;
        b.cuda_device = 0;
        desc->buffers.push_back(b);
        std::vector<const mcrs::BufferDesc *> buffers{&desc->buffers[0]};
        ipc.submit(desc, items, buffers, [&](std::vector<mcrs::TransferItem> &back) {
            fell_back = true;
            for (auto &it : back) it.fail("fell back");
        });
        REQUIRE(batch->wait(30000));
        uint64_t bytes = 0;
        int st = batch->observe(0, &bytes);
        why = batch->task(0).error;
        return st;
    };
    std::string why;
    // Far past the allocation (the first request also maps it), then just
    // past its end, then a sum that would wrap: READ and WRITE.
    for (uint64_t forged : {uint64_t{1} << 40, uint64_t{4096}, UINT64_MAX - 4095}) {
        CHECK_EQ(one(forged, 0, 0, 4096, why), STATUS_FAILED);
        CHECK(why.find("outside the allocation it maps") != std::string::npos);
        CHECK_EQ(one(forged, 1, max - 4096, 4096, why), STATUS_FAILED);
        CHECK(why.find("mc_cuda_ipc_offset " + std::to_string(forged)) != std::string::npos);
    }
    CHECK(!fell_back);
    CHECK_EQ(ipc.copies(), 0u);
    CHECK(peer.holds(0, max, 4242));  // nothing was written
    // The honest descriptor through the same mapping: every byte, both ways.
    CHECK_EQ(one(0, 0, 0, max, why), STATUS_COMPLETED);
    auto expect = random_bytes(max, 4242);
    CHECK(std::memcmp(host.data(), expect.data(), max) == 0);
    auto w = random_bytes(4096, 31);
    std::memcpy(host.data() + max - 4096, w.data(), w.size());
    CHECK_EQ(one(0, 1, max - 4096, 4096, why), STATUS_COMPLETED);
    CHECK(peer.holds(max - 4096, 4096, 31));
    CHECK_EQ(ipc.copies(), 2u);
    CHECK(!fell_back);
}

TEST(gpu_two_processes_two_gpus_use_cuda_ipc) {
    if (!gpu_pair_lane("gpu_two_processes_two_gpus_use_cuda_ipc")) return;
    // Peer on GPU 1, us on GPU 0, and the reverse.
    two_process_ipc(1, 0, 1u << 30, kPairSizes);
    two_process_ipc(0, 1, 64u << 20, kSizes);
}

TEST(gpu_two_gpus_within_one_engine) {
    if (!gpu_pair_lane("gpu_two_gpus_within_one_engine")) return;
    const size_t max = 1u << 30;
    // The engine's choice of path must match what the hardware offers.
    mcrs::gpu::PeerPath p = mcrs::gpu::peer_path(0, 1);
    std::fprintf(stderr, "    GPU 0 -> GPU 1: %s\n", mcrs::gpu::peer_path_name(p));
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    DeviceBuf g0(max, 0), g1(max, 1);
    REQUIRE_EQ(registerLocalMemory(e, g0.ptr, max, "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, g1.ptr, max, "*", 1), 0);
    char loc[64] = {0};
    // Each buffer reports its own device.
    REQUIRE_EQ(mc_memory_location(e, g1.ptr, loc, sizeof loc), 0);
    CHECK_EQ(std::string(loc), std::string("cuda:1"));
    for (size_t sz : kPairSizes) {
        auto data = random_bytes(sz, 9000 + static_cast<uint32_t>(sz));
        g0.upload(data);
        // READ: GPU 1 <- GPU 0.
        REQUIRE_EQ(mc_gpu_memset(1, g1.ptr, 0x5A, max), 0);
        CHECK_EQ(one_transfer(e, OPCODE_READ, g1.ptr, LOCAL_SEGMENT, reinterpret_cast<uint64_t>(g0.ptr), sz), STATUS_COMPLETED);
        CHECK(g1.download(0, sz) == data);
        if (sz < max) CHECK_EQ(g1.download(sz, 1)[0], static_cast<char>(0x5A));
        // WRITE: GPU 1 -> GPU 0.
        auto back = random_bytes(sz, 9500 + static_cast<uint32_t>(sz));
        g1.upload(back);
        REQUIRE_EQ(mc_gpu_memset(0, g0.ptr, 0x66, max), 0);
        CHECK_EQ(one_transfer(e, OPCODE_WRITE, g1.ptr, LOCAL_SEGMENT, reinterpret_cast<uint64_t>(g0.ptr), sz), STATUS_COMPLETED);
        CHECK(g0.download(0, sz) == back);
        if (sz < max) CHECK_EQ(g0.download(sz, 1)[0], static_cast<char>(0x66));
    }
    destroyTransferEngine(e);
}

// A CUDA IPC handle maps the whole allocation in the peer, so only a buffer
// that is a whole allocation gets one; a part of an allocation stays behind
// the owner's range check (TCP).
TEST(gpu_ipc_handle_only_for_whole_allocations) {
    if (!gpu_lane("gpu_ipc_handle_only_for_whole_allocations")) return;
    mcrs::EngineConfig cfg = mcrs::EngineConfig::from_env();
    cfg.local_server_name = "127.0.0.1";
    cfg.bind_address = "127.0.0.1";
    mcrs::TransferEngine e(cfg);
    const size_t kLen = 4u << 20;
    DeviceBuf whole(kLen, 0), parted(kLen, 0);
    e.register_memory(whole.ptr, kLen, "*", true);
    e.register_memory(static_cast<char *>(parted.ptr) + 65536, kLen / 2, "*", true);
    int32_t seg = e.open_segment(e.segment_name(), true);
    auto d = e.segment_desc(seg);
    REQUIRE(d != nullptr);
    int seen = 0;
    for (const auto &b : d->buffers) {
        if (b.addr == reinterpret_cast<uint64_t>(whole.ptr)) {
            CHECK(!b.cuda_ipc.empty());
            ++seen;
        }
        if (b.addr == reinterpret_cast<uint64_t>(parted.ptr) + 65536) {
            CHECK(b.cuda_ipc.empty());
            ++seen;
        }
    }
    CHECK_EQ(seen, 2);
    e.unregister_memory(whole.ptr);
    e.unregister_memory(static_cast<char *>(parted.ptr) + 65536);
}

TEST(gpu_dmabuf_export) {
    if (!gpu_lane("gpu_dmabuf_export")) return;
    int32_t supported = 0;
    REQUIRE_EQ(mc_gpu_dmabuf_supported(0, &supported), 0);
    REQUIRE(supported == 1);
    DeviceBuf d(8u << 20);
    mc_dmabuf_t x{};
    REQUIRE_EQ(mc_gpu_dmabuf_export(d.at(12345), 4096, &x), 0);
    CHECK(x.fd >= 0);
    CHECK_EQ(x.device, 0);
    CHECK_EQ(x.base + x.offset, reinterpret_cast<uint64_t>(d.at(12345)));
    CHECK(x.size >= d.len);
    char link[256] = {0};
    std::string path = "/proc/self/fd/" + std::to_string(x.fd);
    ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    CHECK(n > 0 && std::string(link).find("dmabuf") != std::string::npos);
    close(x.fd);
    // Host memory and ranges past the allocation are refused with a reason.
    std::vector<char> h(64);
    CHECK(mc_gpu_dmabuf_export(h.data(), h.size(), &x) != 0);
    CHECK(std::string(mc_last_error_message()).find("not device memory") != std::string::npos);
    CHECK(mc_gpu_dmabuf_export(d.at(0), (16u << 20) + x.size, &x) != 0);
}
