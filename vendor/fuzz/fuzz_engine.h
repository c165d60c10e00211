// Shared by the stream targets: one real engine per fuzzing process, built
// through the C API only (so the targets do not depend on the servers'
// internals), listening on 127.0.0.1, with registered memory at a fixed
// address so that seeds and mutations can name it:
//
//   kFuzzBase + 0x00000  guard page      (never registered)
//   kFuzzBase + 0x01000  remote buffer   64 KiB, remote-accessible
//   kFuzzBase + 0x11000  guard page
//   kFuzzBase + 0x12000  local buffer    4 KiB, registered local-only
//   kFuzzBase + 0x13000  guard page
//
// The guards and the local-only buffer are filled with canary bytes and
// poisoned for ASan: a server that touches them is reported at the access,
// and fuzz_check_canaries() catches what escaped the interceptors.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sanitizer/asan_interface.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "mooncake_ext.h"

namespace fuzz {

// In the x86-64 user half, away from ASan's shadow and allocator regions.
constexpr uintptr_t kFuzzBase = 0x3f0000000000ull;
constexpr size_t kPage = 4096;
constexpr size_t kRemoteOff = kPage;
constexpr size_t kRemoteLen = 64 * 1024;
constexpr size_t kLocalOff = kRemoteOff + kRemoteLen + kPage;
constexpr size_t kLocalLen = kPage;
constexpr size_t kMapLen = kLocalOff + kLocalLen + kPage;
constexpr unsigned char kCanary = 0xA5;
constexpr unsigned char kLocalFill = 0x5A;

inline unsigned char *base() { return reinterpret_cast<unsigned char *>(kFuzzBase); }
inline unsigned char *remote_buf() { return base() + kRemoteOff; }

// The untouchable parts: [offset, length) with the byte they must hold.
struct Zone {
    size_t off, len;
    unsigned char fill;
};
constexpr Zone kZones[] = {{0, kPage, kCanary},
                           {kRemoteOff + kRemoteLen, kPage, kCanary},
                           {kLocalOff, kLocalLen, kLocalFill},
                           {kLocalOff + kLocalLen, kPage, kCanary}};

inline void quiet_log(void *, int, const char *) {}

struct Engine {
    transfer_engine_t engine = nullptr;
    uint16_t rpc_port = 0, data_port = 0;
};

inline Engine &engine() {
    static Engine e = [] {
        Engine out;
        // Set MC_FUZZ_LOG=1 to see the engine's log while reproducing.
        if (!std::getenv("MC_FUZZ_LOG")) mc_set_log_sink(quiet_log, nullptr, MC_LOG_OFF);
        void *m = ::mmap(base(), kMapLen, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        FUZZ_CHECK(m == base(), "mmap of the fixed fuzz region failed");
        std::memset(base(), kCanary, kMapLen);
        std::memset(base() + kLocalOff, kLocalFill, kLocalLen);
        mc_engine_config_t c;
        mc_engine_config_default(&c);
        c.protocols = MC_PROTOCOL_TCP;
        c.local_server_name = "127.0.0.1";
        c.bind_address = "127.0.0.1";
        c.handshake_timeout_ms = 3000;
        c.tcp_progress_timeout_ms = 1000;
        c.tcp_lanes_per_peer = 1;
        c.enable_same_host = 0;
        out.engine = mc_engine_create(&c);
        FUZZ_CHECK(out.engine != nullptr, mc_last_error_message());
        FUZZ_CHECK(registerLocalMemory(out.engine, remote_buf(), kRemoteLen, "cpu:0", 1) == 0,
                   mc_last_error_message());
        FUZZ_CHECK(registerLocalMemory(out.engine, base() + kLocalOff, kLocalLen, "cpu:0", 0) == 0,
                   mc_last_error_message());
        FUZZ_CHECK(mc_engine_ports(out.engine, &out.rpc_port, &out.data_port) == 0,
                   mc_last_error_message());
        for (const Zone &z : kZones) ASAN_POISON_MEMORY_REGION(base() + z.off, z.len);
        return out;
    }();
    return e;
}

// Aborts (a finding) when a guard or the local-only buffer changed. Call
// only when no server thread can be touching the region.
inline void check_canaries() {
    for (const Zone &z : kZones) {
        ASAN_UNPOISON_MEMORY_REGION(base() + z.off, z.len);
        for (size_t i = 0; i < z.len; ++i)
            if (base()[z.off + i] != z.fill) {
                std::fprintf(stderr, "canary at fuzz region offset %#zx overwritten\n", z.off + i);
                std::abort();
            }
        ASAN_POISON_MEMORY_REGION(base() + z.off, z.len);
    }
}

// Threads of this process (libFuzzer's per-input leak check must not run
// while a server thread that served the input is still freeing its state).
inline size_t thread_count() {
    size_t n = 0;
    if (DIR *d = ::opendir("/proc/self/task")) {
        while (dirent *e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
    }
    return n;
}

// Waits (up to 5 s, then carries on) until no more than `baseline` threads
// run, i.e. a per-connection thread has returned and freed what it held.
inline void settle_threads(size_t baseline) {
    for (int i = 0; i < 5000 && thread_count() > baseline; ++i) ::usleep(1000);
}

// Sends `data` to 127.0.0.1:port while reading what comes back, half-closes,
// and reads until the server closes. A server that keeps the connection
// open for `deadline_ms` after our FIN is a finding (a hang).
inline std::string exchange(uint16_t port, const uint8_t *data, size_t size, int deadline_ms) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket()");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Close with a reset: thousands of connections a second would
    // otherwise use up the local ports in TIME_WAIT.
    linger lg{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    int rc = ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    if (rc != 0 && errno == EINTR) {
        // libFuzzer's timer signal: the connect goes on; wait for it.
        pollfd p{fd, POLLOUT, 0};
        while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if ((p.revents & POLLOUT) && err == 0) rc = 0;
        else errno = err ? err : ETIMEDOUT;
    }
    if (rc != 0) {
        std::fprintf(stderr, "connect to 127.0.0.1:%u: %s\n", port, std::strerror(errno));
        std::abort();
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    std::string got;
    size_t sent = 0;
    bool wr_open = true;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
    for (;;) {
        if (wr_open && sent == size) {
            ::shutdown(fd, SHUT_WR);
            wr_open = false;
        }
        pollfd p{fd, static_cast<short>(POLLIN | (wr_open ? POLLOUT : 0)), 0};
        int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        deadline - std::chrono::steady_clock::now())
                                        .count());
        if (left <= 0) {
            std::fprintf(stderr, "the server kept the connection open %d ms after our %s\n",
                         deadline_ms, wr_open ? "last byte" : "FIN");
            std::abort();
        }
        int r = ::poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        FUZZ_CHECK(r >= 0, "poll()");
        if (p.revents & (POLLIN | POLLERR | POLLHUP)) {
            char buf[65536];
            ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n == 0) break;
            if (n < 0 && errno != EAGAIN && errno != EINTR) break;  // reset: closed too
            if (n > 0) got.append(buf, static_cast<size_t>(n));
        }
        if (wr_open && (p.revents & POLLOUT)) {
            ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
            if (n > 0) sent += static_cast<size_t>(n);
            else if (n < 0 && errno != EAGAIN && errno != EINTR) wr_open = false;  // peer gone
        }
    }
    ::close(fd);
    return got;
}

}  // namespace fuzz
