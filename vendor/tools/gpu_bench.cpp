// GPU path bandwidth next to the ceilings measured in the same run:
// cudaMemcpy device-to-device and pinned host<->device, against the
// engine's local copies, the same-host CUDA IPC path (two processes) and
// TCP with GPU memory (against TCP with host memory). Prints one table.
//
//   make -C vendor gpu_bench CUDA=13 && vendor/build/std-cu13/gpu_bench [size_mib] [iters]
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

void *dev_alloc(size_t n) {
    void *p = nullptr;
    if (mc_gpu_alloc(0, n, &p) != 0) die("mc_gpu_alloc");
    mc_gpu_memset(0, p, 1, n);
    return p;
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

int peer_main(size_t size) {
    transfer_engine_t e = engine(true);
    void *d = dev_alloc(size);
    if (registerLocalMemory(e, d, size, "*", 1) != 0) die("register (peer)");
    std::printf("READY %s %llu\n", name_of(e).c_str(), static_cast<unsigned long long>(reinterpret_cast<uint64_t>(d)));
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin)) {
    }
    destroyTransferEngine(e);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc > 1 && std::string(argv[1]) == "--peer") return peer_main(std::strtoull(argv[2], nullptr, 10));
    setvbuf(stdout, nullptr, _IOLBF, 0);
    size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
    int iters = argc > 2 ? std::atoi(argv[2]) : 20;
    size_t n = mib << 20;
    mc_gpu_info_t info{};
    char why[512];
    mc_gpu_query(&info, why, sizeof why);
    if (!info.usable) {
        std::fprintf(stderr, "gpu_bench: %s\n", why);
        return 1;
    }
    std::printf("mooncake-rs GPU paths, CUDA %d build (runtime %d, driver %d), %zu MiB transfers, median of 5x%d\n\n",
                info.build_cuda_major, info.runtime_version, info.driver_version, mib, iters);
    void *d0 = dev_alloc(n), *d1 = dev_alloc(n);
    void *h0 = pinned_alloc(n), *h1 = pinned_alloc(n);
    std::vector<Row> rows;
    double c_d2d = measure(n, iters, [&] { mc_gpu_memcpy(d1, d0, n); });
    double c_h2d = measure(n, iters, [&] { mc_gpu_memcpy(d0, h0, n); });
    double c_d2h = measure(n, iters, [&] { mc_gpu_memcpy(h0, d0, n); });
    double c_h2h = measure(n, iters, [&] { std::memcpy(h1, h0, n); });

    transfer_engine_t e = engine(true);
    for (void *p : {d0, d1, h0, h1})
        if (registerLocalMemory(e, p, n, "*", 1) != 0) die("register");
    auto local = [&](void *dst, void *src) {
        return measure(n, iters, [&] { transfer(e, OPCODE_READ, dst, LOCAL_SEGMENT, reinterpret_cast<uint64_t>(src), n, 1); });
    };
    rows.push_back({"engine local GPU->GPU", local(d1, d0), "cudaMemcpy D2D", c_d2d});
    rows.push_back({"engine local host->GPU", local(d0, h0), "cudaMemcpy pinned H2D", c_h2d});
    rows.push_back({"engine local GPU->host", local(h0, d0), "cudaMemcpy pinned D2H", c_d2h});

    // Same-host path: a peer process with a GPU buffer.
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return 1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    // The child must not hold the write end of its own stdin, or it never
    // sees EOF.
    posix_spawn_file_actions_addclose(&fa, to_child[1]);
    posix_spawn_file_actions_addclose(&fa, from_child[0]);
    std::string size_s = std::to_string(n);
    char *args[] = {argv[0], const_cast<char *>("--peer"), &size_s[0], nullptr};
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, args, environ) != 0) return 1;
    close(to_child[0]);
    close(from_child[1]);
    FILE *in = fdopen(from_child[0], "r");
    char line[512];
    if (!std::fgets(line, sizeof line, in)) return 1;
    char seg_name[256];
    unsigned long long remote = 0;
    std::sscanf(line, "READY %255s %llu", seg_name, &remote);
    segment_id_t ps = openSegment(e, seg_name);
    if (ps < 0) die("openSegment (peer)");
    rows.push_back({"CUDA IPC, other process, READ", measure(n, iters, [&] { transfer(e, OPCODE_READ, d1, ps, remote, n, 1); }),
                    "cudaMemcpy D2D", c_d2d});
    rows.push_back({"CUDA IPC, other process, WRITE", measure(n, iters, [&] { transfer(e, OPCODE_WRITE, d1, ps, remote, n, 1); }),
                    "cudaMemcpy D2D", c_d2d});
    close(to_child[1]);
    waitpid(pid, nullptr, 0);

    // TCP: two engines in one process (same pid, so no IPC), 16 requests.
    transfer_engine_t t = engine(false);
    void *td = dev_alloc(n), *th = pinned_alloc(n);
    std::vector<char> hp(n, 3), tp(n, 4);
    for (void *p : {td, th, static_cast<void *>(tp.data())})
        if (registerLocalMemory(t, p, n, "*", 1) != 0) die("register (tcp target)");
    if (registerLocalMemory(e, hp.data(), n, "*", 1) != 0) die("register host");
    segment_id_t ts = openSegment(e, name_of(t).c_str());
    if (ts < 0) die("openSegment (tcp)");
    double tcp_host_r = measure(n, iters / 4 + 1, [&] { transfer(e, OPCODE_READ, hp.data(), ts, reinterpret_cast<uint64_t>(tp.data()), n, 16); });
    double tcp_host_w = measure(n, iters / 4 + 1, [&] { transfer(e, OPCODE_WRITE, hp.data(), ts, reinterpret_cast<uint64_t>(tp.data()), n, 16); });
    rows.push_back({"TCP GPU->GPU READ", measure(n, iters / 4 + 1, [&] { transfer(e, OPCODE_READ, d1, ts, reinterpret_cast<uint64_t>(td), n, 16); }),
                    "TCP host READ", tcp_host_r});
    rows.push_back({"TCP GPU->GPU WRITE", measure(n, iters / 4 + 1, [&] { transfer(e, OPCODE_WRITE, d1, ts, reinterpret_cast<uint64_t>(td), n, 16); }),
                    "TCP host WRITE", tcp_host_w});
    rows.push_back({"TCP GPU->host READ", measure(n, iters / 4 + 1, [&] { transfer(e, OPCODE_READ, hp.data(), ts, reinterpret_cast<uint64_t>(td), n, 16); }),
                    "TCP host READ", tcp_host_r});

    std::printf("%-32s %10s   %-24s %10s %8s\n", "path", "GB/s", "ceiling (same run)", "GB/s", "ratio");
    for (const auto &r : rows)
        std::printf("%-32s %10.2f   %-24s %10.2f %7.0f%%\n", r.path.c_str(), r.gbps, r.ceiling_name.c_str(), r.ceiling,
                    100.0 * r.gbps / r.ceiling);
    std::printf("%-32s %10.2f\n", "(memcpy host->host)", c_h2h);
    destroyTransferEngine(t);
    destroyTransferEngine(e);
    return 0;
}
