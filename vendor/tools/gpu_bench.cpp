// GPU path bandwidth next to the ceilings measured in the same run:
// cudaMemcpy device-to-device and pinned host<->device, against the
// engine's local copies, the same-host CUDA IPC path (two processes) and
// TCP with GPU memory (against TCP with host memory). With two GPUs, also
// GPU 0 <-> GPU 1 within one engine and between two processes, against
// cudaMemcpyPeer. Prints one table.
//
//   make -C vendor gpu_bench CUDA=13 && vendor/build/std-cu13/gpu_bench [size_mib] [iters]
//   gpu_bench kv [--iters N] [--op read|write|both]: KV-cache layouts
//   (llama8b, mla; one descriptor per block), contiguous vs scattered
//   (every other block), over gpu-tcp and gpu-ipc.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_api.h"
#include "gpu/gpu.h"
#include "gpu/ipc_handle.h"
#include "mooncake_ext.h"

extern char **environ;

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "gpu_bench: %s: %s\n", what, mc_last_error_message());
    std::exit(1);
}

transfer_engine_t engine(bool ipc) {
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.local_server_name = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.enable_cuda_ipc = ipc ? 1 : 0;
    transfer_engine_t e = mc_engine_create(&c);
    if (!e) die("mc_engine_create");
    return e;
}

std::string name_of(transfer_engine_t e) {
    char buf[128];
    size_t n = 0;
    mc_engine_segment_name(e, buf, sizeof buf, &n);
    return buf;
}

void *dev_alloc(size_t n, int device = 0) {
    void *p = nullptr;
    if (mc_gpu_alloc(device, n, &p) != 0) die("mc_gpu_alloc");
    mc_gpu_memset(device, p, 1, n);
    return p;
}

// cudaMemcpy through this process's own mapping of a peer's buffer: what
// the same-host path could reach at best, the mapping's cost included.
double ipc_mapping_ceiling(const std::string &hex, void *local, size_t n, int iters, bool into_mapping);

// The ceiling for GPU-to-GPU: the runtime's own peer copy, with peer access
// enabled both ways (as any tuned application would).
void enable_peer_access(int a, int b) {
    cudaSetDevice(a);
    cudaDeviceEnablePeerAccess(b, 0);
    cudaSetDevice(b);
    cudaDeviceEnablePeerAccess(a, 0);
    cudaGetLastError();
}

void memcpy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
    if (cudaMemcpyPeer(dst, dst_dev, src, src_dev, n) != cudaSuccess) die("cudaMemcpyPeer");
    cudaSetDevice(dst_dev);
    cudaDeviceSynchronize();
}

void *pinned_alloc(size_t n) {
    void *p = nullptr;
    if (mc_gpu_alloc_pinned(n, &p) != 0) die("mc_gpu_alloc_pinned");
    std::memset(p, 2, n);
    return p;
}

// Median GB/s of `rounds` rounds of `iters` calls of `fn`, each moving
// `bytes`.
double measure(size_t bytes, int iters, const std::function<void()> &fn) {
    fn();  // warm up (connections, mappings)
    std::vector<double> r;
    for (int k = 0; k < 5; ++k) {
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) fn();
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        r.push_back(static_cast<double>(bytes) * iters / s / 1e9);
    }
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
}

void transfer(transfer_engine_t e, int op, void *local, segment_id_t seg, uint64_t remote, size_t len, size_t chunks) {
    batch_id_t b = allocateBatchID(e, chunks);
    std::vector<transfer_request> reqs;
    size_t per = len / chunks;
    for (size_t i = 0; i < chunks; ++i)
        reqs.push_back(transfer_request{op, static_cast<char *>(local) + i * per, seg, remote + i * per, per});
    if (submitTransfer(e, b, reqs.data(), reqs.size()) != 0) die("submitTransfer");
    if (mc_batch_wait(e, b, 120000) != 0) die("mc_batch_wait");
    for (size_t i = 0; i < chunks; ++i) {
        transfer_status st{};
        getTransferStatus(e, b, i, &st);
        if (st.status != STATUS_COMPLETED) {
            char why[512];
            size_t n = 0;
            mc_transfer_error(e, b, i, why, sizeof why, &n);
            std::fprintf(stderr, "gpu_bench: transfer failed: %s\n", why);
            std::exit(1);
        }
    }
    freeBatchID(e, b);
}

struct Row {
    std::string path;
    double gbps;
    std::string ceiling_name;
    double ceiling;
};

int peer_main(size_t size, int device) {
    transfer_engine_t e = engine(true);
    void *d = dev_alloc(size, device);
    if (registerLocalMemory(e, d, size, "*", 1) != 0) die("register (peer)");
    // Also hand out the raw IPC handle, for the bench's own mapping ceiling.
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, d) != cudaSuccess) die("cudaIpcGetMemHandle");
    const std::string hex = mcrs::gpu::format_ipc_handle(h);
    std::printf("READY %s %llu %s\n", name_of(e).c_str(), static_cast<unsigned long long>(reinterpret_cast<uint64_t>(d)),
                hex.c_str());
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin)) {
    }
    destroyTransferEngine(e);
    return 0;
}

double ipc_mapping_ceiling(const std::string &hex, void *local, size_t n, int iters, bool into_mapping) {
    cudaIpcMemHandle_t h;
    if (!mcrs::gpu::parse_ipc_handle(hex, h)) die("malformed IPC handle from the peer");
    cudaSetDevice(0);
    void *mapped = nullptr;
    if (cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) die("cudaIpcOpenMemHandle");
    void *dst = into_mapping ? mapped : local;
    void *src = into_mapping ? local : mapped;
    double r = measure(n, iters, [&] {
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cudaStreamPerThread);
        cudaStreamSynchronize(cudaStreamPerThread);
    });
    cudaIpcCloseMemHandle(mapped);
    return r;
}

// A peer process (this binary with --peer) holding a GPU buffer on
// `device`; it exits when its stdin closes.
struct Peer {
    pid_t pid = 0;
    int to_child = -1;
    std::string segment;
    uint64_t addr = 0;
    std::string handle;  // the buffer's CUDA IPC handle, hex
    Peer(char *self, size_t n, int device) {
        int to[2], from[2];
        if (pipe(to) != 0 || pipe(from) != 0) die("pipe");
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, to[0], 0);
        posix_spawn_file_actions_adddup2(&fa, from[1], 1);
        // The child must not hold the write end of its own stdin, or it
        // never sees EOF.
        posix_spawn_file_actions_addclose(&fa, to[1]);
        posix_spawn_file_actions_addclose(&fa, from[0]);
        std::string size_s = std::to_string(n), dev_s = std::to_string(device);
        char *args[] = {self, const_cast<char *>("--peer"), &size_s[0], &dev_s[0], nullptr};
        if (posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, args, environ) != 0) die("posix_spawn");
        posix_spawn_file_actions_destroy(&fa);
        close(to[0]);
        close(from[1]);
        to_child = to[1];
        FILE *in = fdopen(from[0], "r");
        char line[512];
        char seg[256], hex[300];
        unsigned long long remote = 0;
        if (!std::fgets(line, sizeof line, in) || std::sscanf(line, "READY %255s %llu %299s", seg, &remote, hex) != 3)
            die("peer did not start");
        fclose(in);
        segment = seg;
        addr = remote;
        handle = hex;
    }
    ~Peer() {
        close(to_child);
        waitpid(pid, nullptr, 0);
    }
};

// KV layouts as in src/sim/kv_layouts.rs: `tensors` tensors of `blocks`
// blocks of `block_bytes` each; a transfer names `moved` blocks per tensor,
// one descriptor each, consecutive or every other one.
struct KvLayout {
    const char *name;
    size_t tensors;
    size_t block_bytes;
};
constexpr size_t kKvBlocks = 128, kKvMoved = 64;

std::vector<transfer_request> kv_requests(const KvLayout &l, int op, char *local, segment_id_t seg, uint64_t remote,
                                          bool scattered) {
    std::vector<transfer_request> r;
    for (size_t t = 0; t < l.tensors; ++t)
        for (size_t b = 0; b < kKvMoved; ++b) {
            size_t off = (t * kKvBlocks + (scattered ? 2 * b : b)) * l.block_bytes;
            r.push_back(transfer_request{op, local + off, seg, remote + off, l.block_bytes});
        }
    return r;
}

void run_batch(transfer_engine_t e, std::vector<transfer_request> &reqs) {
    batch_id_t b = allocateBatchID(e, reqs.size());
    if (submitTransfer(e, b, reqs.data(), reqs.size()) != 0) die("submitTransfer");
    if (mc_batch_wait(e, b, 120000) != 0) die("mc_batch_wait");
    for (size_t i = 0; i < reqs.size(); ++i) {
        transfer_status st{};
        getTransferStatus(e, b, i, &st);
        if (st.status != STATUS_COMPLETED) die("KV transfer failed");
    }
    freeBatchID(e, b);
}

int kv_main(char *self, int argc, char **argv) {
    int iters = 3;
    std::string ops = "both";
    for (int i = 2; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--iters") iters = std::atoi(argv[i + 1]);
        else if (k == "--op") ops = argv[i + 1];
    }
    // small: 4 KiB blocks, where the per-descriptor cost shows.
    const KvLayout layouts[] = {
        {"llama8b", 64, 16 * 8 * 128 * 2}, {"mla", 61, 64 * 576 * 2}, {"small", 48, 16 * 2 * 64 * 2}};
    size_t n = 0;
    for (const auto &l : layouts) n = std::max(n, l.tensors * kKvBlocks * l.block_bytes);
    std::printf("KV layouts, %zu of %zu blocks per tensor, one descriptor per block, median of 5x%d\n", kKvMoved,
                kKvBlocks, iters);
    std::printf("%-8s %-14s %-6s %7s %12s %12s %8s %13s\n", "layout", "path", "op", "descs", "contig GB/s",
                "scatter GB/s", "ratio", "us/desc (sc)");
    transfer_engine_t e = engine(true);
    transfer_engine_t t = engine(false);
    char *ld = static_cast<char *>(dev_alloc(n)), *td = static_cast<char *>(dev_alloc(n));
    if (registerLocalMemory(e, ld, n, "*", 1) != 0 || registerLocalMemory(t, td, n, "*", 1) != 0) die("register");
    segment_id_t ts = openSegment(e, name_of(t).c_str());
    if (ts < 0) die("openSegment (tcp)");
    Peer peer(self, n, 0);
    segment_id_t ps = openSegment(e, peer.segment.c_str());
    if (ps < 0) die("openSegment (peer)");
    struct P {
        const char *name;
        segment_id_t seg;
        uint64_t remote;
    } paths[] = {{"gpu-tcp", ts, reinterpret_cast<uint64_t>(td)}, {"gpu-ipc", ps, peer.addr}};
    for (const auto &l : layouts)
        for (const auto &p : paths)
            for (int op : {OPCODE_READ, OPCODE_WRITE}) {
                if ((op == OPCODE_READ && ops == "write") || (op == OPCODE_WRITE && ops == "read")) continue;
                double g[2];
                for (int sc = 0; sc < 2; ++sc) {
                    auto reqs = kv_requests(l, op, ld, p.seg, p.remote, sc == 1);
                    g[sc] = measure(l.tensors * kKvMoved * l.block_bytes, iters, [&] { run_batch(e, reqs); });
                }
                const size_t descs = l.tensors * kKvMoved;
                const double us = descs * l.block_bytes / (g[1] * 1e3) / descs;  // GB/s -> us per batch
                std::printf("%-8s %-14s %-6s %7zu %12.2f %12.2f %7.0f%% %13.3f\n", l.name, p.name,
                            op == OPCODE_READ ? "READ" : "WRITE", descs, g[0], g[1], 100.0 * g[1] / g[0], us);
            }
    closeSegment(e, ps);
    closeSegment(e, ts);
    destroyTransferEngine(t);
    destroyTransferEngine(e);
    return 0;
}

// `gpu_bench kvprof [--tensors T] [--blocks B] [--block KIB] [--iters I]`:
// where the time of one scattered same-host GPU pull goes. Every other one
// of B blocks of each of T tensors, READ and WRITE against a peer process's
// buffer: each phase of the C API call sequence, then the same pieces
// through gpu::copy_many on this process's own mapping (the copy alone),
// and one contiguous cudaMemcpy of the same bytes (the ceiling).
int kvprof_main(char *self, int argc, char **argv) {
    size_t tensors = 64, blocks = 1024, block = 32 << 10;
    int iters = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--tensors") tensors = std::strtoull(argv[i + 1], nullptr, 10);
        else if (k == "--blocks") blocks = std::strtoull(argv[i + 1], nullptr, 10);
        else if (k == "--block") block = std::strtoull(argv[i + 1], nullptr, 10) << 10;
        else if (k == "--iters") iters = std::atoi(argv[i + 1]);
    }
    const size_t n = tensors * blocks * block, moved = blocks / 2, descs = tensors * moved;
    const double bytes = static_cast<double>(descs * block);
    transfer_engine_t e = engine(true);
    char *ld = static_cast<char *>(dev_alloc(n));
    if (registerLocalMemory(e, ld, n, "*", 1) != 0) die("register");
    Peer peer(self, n, 0);
    segment_id_t ps = openSegment(e, peer.segment.c_str());
    if (ps < 0) die("openSegment (peer)");
    std::printf("kvprof: %zu tensors x %zu of %zu blocks of %zu KiB = %zu descriptors, %.0f MiB, mean of %d\n",
                tensors, moved, blocks, block >> 10, descs, bytes / (1 << 20), iters);
    std::printf("%-6s %10s %10s %10s %10s %10s %10s %9s\n", "op", "alloc", "submit", "wait", "status", "free",
                "total", "GB/s");
    for (int op : {OPCODE_READ, OPCODE_WRITE}) {
        std::vector<transfer_request> reqs;
        for (size_t t = 0; t < tensors; ++t)
            for (size_t b = 0; b < moved; ++b) {
                size_t off = (t * blocks + 2 * b) * block;
                reqs.push_back(transfer_request{op, ld + off, ps, peer.addr + off, block});
            }
        double ph[5] = {0, 0, 0, 0, 0};
        for (int it = 0; it <= iters; ++it) {
            auto t0 = Clock::now();
            batch_id_t b = allocateBatchID(e, reqs.size());
            auto t1 = Clock::now();
            if (submitTransfer(e, b, reqs.data(), reqs.size()) != 0) die("submitTransfer");
            auto t2 = Clock::now();
            if (mc_batch_wait(e, b, 120000) != 0) die("mc_batch_wait");
            auto t3 = Clock::now();
            for (size_t i = 0; i < reqs.size(); ++i) {
                transfer_status st{};
                getTransferStatus(e, b, i, &st);
                if (st.status != STATUS_COMPLETED) die("KV transfer failed");
            }
            auto t4 = Clock::now();
            freeBatchID(e, b);
            auto t5 = Clock::now();
            if (it == 0) continue;  // warm-up: the mapping is opened here
            const Clock::time_point ts[] = {t0, t1, t2, t3, t4, t5};
            for (int k = 0; k < 5; ++k) ph[k] += std::chrono::duration<double, std::micro>(ts[k + 1] - ts[k]).count();
        }
        double total = 0;
        for (double &x : ph) total += (x /= iters);
        std::printf("%-6s %8.0fus %8.0fus %8.0fus %8.0fus %8.0fus %8.0fus %9.1f\n", op == OPCODE_READ ? "READ" : "WRITE",
                    ph[0], ph[1], ph[2], ph[3], ph[4], total, bytes / total / 1e3);
    }
    // The copy alone, through this process's own mapping of the peer's buffer.
    cudaIpcMemHandle_t h;
    if (!mcrs::gpu::parse_ipc_handle(peer.handle, h)) die("malformed IPC handle from the peer");
    cudaSetDevice(0);
    void *mapped = nullptr;
    if (cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) die("cudaIpcOpenMemHandle");
    std::vector<mcrs::gpu::CopyPiece> pieces;
    for (size_t t = 0; t < tensors; ++t)
        for (size_t b = 0; b < moved; ++b) {
            size_t off = (t * blocks + 2 * b) * block;
            pieces.push_back(mcrs::gpu::CopyPiece{ld + off, 0, static_cast<char *>(mapped) + off, 0, block});
        }
    auto timed = [&](const std::function<void()> &fn) {
        fn();
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) fn();
        return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
    };
    double many = timed([&] { mcrs::gpu::copy_many(pieces.data(), pieces.size()); });
    double one = timed([&] {
        cudaMemcpyAsync(ld, mapped, descs * block, cudaMemcpyDefault, cudaStreamPerThread);
        cudaStreamSynchronize(cudaStreamPerThread);
    });
    std::printf("copy_many of the same %zu pieces (READ): %.0fus, %.1f GB/s, %.3f us/piece\n", pieces.size(), many,
                bytes / many / 1e3, many / pieces.size());
    std::printf("one contiguous cudaMemcpy of the same bytes:  %.0fus, %.1f GB/s\n", one, bytes / one / 1e3);
    cudaIpcCloseMemHandle(mapped);
    closeSegment(e, ps);
    destroyTransferEngine(e);
    return 0;
}

// The buffers and ceilings every row of the 64 MiB table shares.
struct Bench {
    char *self;
    size_t n;
    int iters;
    void *d0, *d1, *h0, *h1;
    double c_d2d, c_h2d, c_d2h, c_h2h;
    transfer_engine_t e;
    std::vector<Row> rows;

    double local(void *dst, void *src) {
        return measure(n, iters, [&] { transfer(e, OPCODE_READ, dst, LOCAL_SEGMENT, reinterpret_cast<uint64_t>(src), n, 1); });
    }
    double remote(int op, void *mine, segment_id_t seg, uint64_t addr, int rounds, size_t chunks) {
        return measure(n, rounds, [&] { transfer(e, op, mine, seg, addr, n, chunks); });
    }
};

void local_rows(Bench &b) {
    b.rows.push_back({"engine local GPU->GPU", b.local(b.d1, b.d0), "cudaMemcpy D2D", b.c_d2d});
    b.rows.push_back({"engine local host->GPU", b.local(b.d0, b.h0), "cudaMemcpy pinned H2D", b.c_h2d});
    b.rows.push_back({"engine local GPU->host", b.local(b.h0, b.d0), "cudaMemcpy pinned D2H", b.c_d2h});
}

// Same-host path: a peer process with a GPU buffer (on GPU 1 too when
// there are two).
void ipc_rows(Bench &b, int device_count) {
    {
        Peer peer(b.self, b.n, 0);
        segment_id_t ps = openSegment(b.e, peer.segment.c_str());
        if (ps < 0) die("openSegment (peer)");
        double c_map_r = ipc_mapping_ceiling(peer.handle, b.d1, b.n, b.iters, false);
        double c_map_w = ipc_mapping_ceiling(peer.handle, b.d1, b.n, b.iters, true);
        double r = b.remote(OPCODE_READ, b.d1, ps, peer.addr, b.iters, 1);
        double w = b.remote(OPCODE_WRITE, b.d1, ps, peer.addr, b.iters, 1);
        b.rows.push_back({"CUDA IPC, other process, READ", r, "cudaMemcpy D2D", b.c_d2d});
        b.rows.push_back({"CUDA IPC, other process, WRITE", w, "cudaMemcpy D2D", b.c_d2d});
        b.rows.push_back({"CUDA IPC, other process, READ", r, "cudaMemcpy from mapping", c_map_r});
        b.rows.push_back({"CUDA IPC, other process, WRITE", w, "cudaMemcpy into mapping", c_map_w});
        closeSegment(b.e, ps);
    }
    if (device_count < 2) {
        std::printf("(one GPU visible: GPU 0 <-> GPU 1 rows need two)\n\n");
        return;
    }
    // GPU 0 <-> GPU 1: within this engine and with a peer process on GPU 1.
    enable_peer_access(0, 1);
    void *g1 = dev_alloc(b.n, 1);
    if (registerLocalMemory(b.e, g1, b.n, "*", 1) != 0) die("register (GPU 1)");
    double c_01 = measure(b.n, b.iters, [&] { memcpy_peer(g1, 1, b.d0, 0, b.n); });
    double c_10 = measure(b.n, b.iters, [&] { memcpy_peer(b.d0, 0, g1, 1, b.n); });
    b.rows.push_back({"engine local GPU0->GPU1", b.local(g1, b.d0), "cudaMemcpyPeer 0->1", c_01});
    b.rows.push_back({"engine local GPU1->GPU0", b.local(b.d0, g1), "cudaMemcpyPeer 1->0", c_10});
    Peer peer(b.self, b.n, 1);
    segment_id_t ps = openSegment(b.e, peer.segment.c_str());
    if (ps < 0) die("openSegment (peer on GPU 1)");
    b.rows.push_back({"CUDA IPC, GPU1 process -> GPU0 READ", b.remote(OPCODE_READ, b.d0, ps, peer.addr, b.iters, 1),
                      "cudaMemcpyPeer 1->0", c_10});
    b.rows.push_back({"CUDA IPC, GPU0 -> GPU1 process WRITE", b.remote(OPCODE_WRITE, b.d0, ps, peer.addr, b.iters, 1),
                      "cudaMemcpyPeer 0->1", c_01});
    closeSegment(b.e, ps);
}

// TCP: two engines in one process (same pid, so no IPC), 16 requests.
// Returns the target engine, destroyed by the caller after the table.
transfer_engine_t tcp_rows(Bench &b, std::vector<char> &hp, std::vector<char> &tp) {
    transfer_engine_t t = engine(false);
    void *td = dev_alloc(b.n), *th = pinned_alloc(b.n);
    for (void *p : {td, th, static_cast<void *>(tp.data())})
        if (registerLocalMemory(t, p, b.n, "*", 1) != 0) die("register (tcp target)");
    if (registerLocalMemory(b.e, hp.data(), b.n, "*", 1) != 0) die("register host");
    segment_id_t ts = openSegment(b.e, name_of(t).c_str());
    if (ts < 0) die("openSegment (tcp)");
    const int rounds = b.iters / 4 + 1;
    const uint64_t host_target = reinterpret_cast<uint64_t>(tp.data()), gpu_target = reinterpret_cast<uint64_t>(td);
    double host_r = b.remote(OPCODE_READ, hp.data(), ts, host_target, rounds, 16);
    double host_w = b.remote(OPCODE_WRITE, hp.data(), ts, host_target, rounds, 16);
    b.rows.push_back({"TCP GPU->GPU READ", b.remote(OPCODE_READ, b.d1, ts, gpu_target, rounds, 16), "TCP host READ", host_r});
    b.rows.push_back({"TCP GPU->GPU WRITE", b.remote(OPCODE_WRITE, b.d1, ts, gpu_target, rounds, 16), "TCP host WRITE", host_w});
    b.rows.push_back({"TCP GPU->host READ", b.remote(OPCODE_READ, hp.data(), ts, gpu_target, rounds, 16), "TCP host READ", host_r});
    return t;
}

bool gpu_usable(mc_gpu_info_t &info) {
    char why[512];
    mc_gpu_query(&info, why, sizeof why);
    if (!info.usable) std::fprintf(stderr, "gpu_bench: %s\n", why);
    return info.usable != 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc > 3 && std::string(argv[1]) == "--peer")
        return peer_main(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
    setvbuf(stdout, nullptr, _IOLBF, 0);
    mc_gpu_info_t info{};
    if (!gpu_usable(info)) return 1;
    if (argc > 1 && std::string(argv[1]) == "kv") return kv_main(argv[0], argc, argv);
    if (argc > 1 && std::string(argv[1]) == "kvprof") return kvprof_main(argv[0], argc, argv);
    size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
    int iters = argc > 2 ? std::atoi(argv[2]) : 20;
    size_t n = mib << 20;
    std::printf("mooncake-rs GPU paths, CUDA %d build (runtime %d, driver %d), %zu MiB transfers, median of 5x%d\n\n",
                info.build_cuda_major, info.runtime_version, info.driver_version, mib, iters);
    Bench b{argv[0], n, iters, dev_alloc(n), dev_alloc(n), pinned_alloc(n), pinned_alloc(n), 0, 0, 0, 0, nullptr, {}};
    b.c_d2d = measure(n, iters, [&] { mc_gpu_memcpy(b.d1, b.d0, n); });
    b.c_h2d = measure(n, iters, [&] { mc_gpu_memcpy(b.d0, b.h0, n); });
    b.c_d2h = measure(n, iters, [&] { mc_gpu_memcpy(b.h0, b.d0, n); });
    b.c_h2h = measure(n, iters, [&] { std::memcpy(b.h1, b.h0, n); });
    b.e = engine(true);
    for (void *p : {b.d0, b.d1, b.h0, b.h1})
        if (registerLocalMemory(b.e, p, n, "*", 1) != 0) die("register");
    local_rows(b);
    ipc_rows(b, info.device_count);
    std::vector<char> hp(n, 3), tp(n, 4);
    transfer_engine_t t = tcp_rows(b, hp, tp);

    std::printf("%-32s %10s   %-24s %10s %8s\n", "path", "GB/s", "ceiling (same run)", "GB/s", "ratio");
    for (const auto &r : b.rows)
        std::printf("%-32s %10.2f   %-24s %10.2f %7.0f%%\n", r.path.c_str(), r.gbps, r.ceiling_name.c_str(), r.ceiling,
                    100.0 * r.gbps / r.ceiling);
    std::printf("%-32s %10.2f\n", "(memcpy host->host)", b.c_h2h);
    destroyTransferEngine(t);
    destroyTransferEngine(b.e);
    return 0;
}
