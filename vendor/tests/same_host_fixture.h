// Shared pieces of the same-host transport tests (test_same_host.cpp,
// test_same_host_wire.cpp): one-request helpers, canary-guarded memory, the
// peer process driven over pipes (Child) and a raw same-host socket client
// (RawUnix).
#pragma once

#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/host_port.h"
#include "engine_fixture.h"
#include "handshake/frame.h"
#include "handshake/handshake_client.h"
#include "transport/samehost/peer_identity.h"
#include "transport/samehost/samehost_wire.h"

extern char **environ;

namespace shtest {

using namespace mctest;

constexpr size_t kCanary = 4096;
constexpr char kCanaryByte = static_cast<char>(0xCC);

inline bool contains(const std::string &s, const char *needle) { return s.find(needle) != std::string::npos; }

inline uint64_t fnv(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
    return h;
}

inline EngineOptions same_host(bool on = true) {
    EngineOptions o;
    o.same_host = on;
    // Sanitizer builds copy 16 MiB slowly; nothing here tests a timeout.
    o.progress_timeout_ms = 60000;
    return o;
}


inline std::string error_of(transfer_engine_t e, batch_id_t b, size_t task) {
    char why[1024];
    size_t need = 0;
    if (mc_transfer_error(e, b, task, why, sizeof why, &need) != 0) return "";
    return why;
}

// One request in its own batch; returns the status and the error text.
inline int one(transfer_engine_t e, int op, void *local, segment_id_t seg, uint64_t remote, size_t len,
        std::string *why = nullptr) {
    batch_id_t b = allocateBatchID(e, 1);
    transfer_request r{op, local, seg, remote, len};
    if (submitTransfer(e, b, &r, 1) != 0) return -1;
    mc_batch_wait(e, b, 20000);
    transfer_status st{};
    getTransferStatus(e, b, 0, &st);
    std::string w = error_of(e, b, 0);
    if (st.status == STATUS_FAILED && !why) std::fprintf(stderr, "    (task failed: %s)\n", w.c_str());
    if (why) *why = w;
    freeBatchID(e, b);
    return st.status;
}

inline mcrs::Json descriptor_json(transfer_engine_t e) {
    mcrs::HandshakeClientOptions ho;
    ho.timeout_ms = 3000;
    return mcrs::handshake_request("127.0.0.1", rpc_port(e), mcrs::kHsMetadata, mcrs::Json::object(), ho);
}

// Memory with canary pages on both sides of the part handed out.
struct Guarded {
    std::vector<char> all;
    size_t size;
    explicit Guarded(size_t n) : all(n + 2 * kCanary, kCanaryByte), size(n) {}
    char *data() { return all.data() + kCanary; }
    uint64_t addr() { return reinterpret_cast<uint64_t>(data()); }
    bool canaries_intact() const {
        for (size_t i = 0; i < kCanary; ++i)
            if (all[i] != kCanaryByte || all[kCanary + size + i] != kCanaryByte) return false;
        return true;
    }
};

// The peer process: an engine (same-host path on) with a remote-accessible
// buffer guarded by canaries and a local-only buffer, driven by commands.
struct Child {
    pid_t pid = -1;
    FILE *in = nullptr;
    FILE *out = nullptr;
    std::string seg_name;
    uint64_t buf = 0, local_only = 0;
    size_t size = 0;

    Child(size_t bytes, uint32_t seed) : size(bytes) {
        int to_child[2], from_child[2];
        REQUIRE(pipe(to_child) == 0 && pipe(from_child) == 0);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
        posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
        posix_spawn_file_actions_addclose(&fa, to_child[1]);
        posix_spawn_file_actions_addclose(&fa, from_child[0]);
        std::string size_s = std::to_string(bytes), seed_s = std::to_string(seed);
        char *args[] = {const_cast<char *>("engine_tests"), const_cast<char *>("--same-host-peer"), &size_s[0],
                        &seed_s[0], nullptr};
        REQUIRE(posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, args, environ) == 0);
        posix_spawn_file_actions_destroy(&fa);
        close(to_child[0]);
        close(from_child[1]);
        in = fdopen(from_child[0], "r");
        out = fdopen(to_child[1], "w");
        std::string line = ask("");
        char name[256];
        unsigned long long b = 0, lo = 0;
        REQUIRE(std::sscanf(line.c_str(), "READY %255s %llu %llu", name, &b, &lo) == 3);
        seg_name = name;
        buf = b;
        local_only = lo;
    }
    ~Child() {
        if (out) {
            std::fprintf(out, "quit\n");
            std::fflush(out);
        }
        int status = 0;
        if (pid > 0) waitpid(pid, &status, 0);
        if (in) fclose(in);
        if (out) fclose(out);
    }
    // Sends a command line (none when empty) and returns the answer line.
    std::string ask(const std::string &cmd) {
        if (!cmd.empty()) {
            std::fprintf(out, "%s\n", cmd.c_str());
            std::fflush(out);
        }
        char line[512] = {0};
        if (!std::fgets(line, sizeof line, in)) return "";
        std::string s(line);
        if (!s.empty() && s.back() == '\n') s.pop_back();
        return s;
    }
    uint64_t hash(size_t off, size_t len) {
        return std::strtoull(ask("hash " + std::to_string(off) + " " + std::to_string(len)).c_str(), nullptr, 10);
    }
    // same_host_served, tcp_requests_served, tcp_requests_rejected
    std::vector<uint64_t> counters() {
        std::string s = ask("counters");
        unsigned long long a = 0, b = 0, c = 0;
        std::sscanf(s.c_str(), "%llu %llu %llu", &a, &b, &c);
        return {a, b, c};
    }
    std::string socket_name() { return ask("socket"); }
};

// A raw Unix connection to a same-host socket, for protocol-abuse tests.
struct RawUnix {
    mcrs::Fd fd;
    explicit RawUnix(const std::string &name) {
        std::string err;
        fd = mcrs::connect_samehost(name, err);
        if (fd.valid()) mcrs::set_io_timeouts(fd.get(), 5000, 5000);
    }
    std::string read_exact(size_t n) {
        std::string out(n, '\0');
        size_t got = 0;
        while (got < n) {
            ssize_t k = ::recv(fd.get(), &out[got], n - got, 0);
            if (k <= 0) break;
            got += static_cast<size_t>(k);
        }
        out.resize(got);
        return out;
    }
    bool greeted() { return read_exact(8) == status(mcrs::kSameHostOk); }
    std::string request(uint8_t op, uint64_t target, uint64_t len, uint64_t initiator) {
        unsigned char b[mcrs::kSameHostRequestLen];
        mcrs::encode_samehost_request(mcrs::SameHostRequest{op, target, len, initiator}, b);
        if (::send(fd.get(), b, sizeof b, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof b)) return "";
        return read_exact(8);
    }
    bool at_eof() { return read_exact(1).empty(); }
    static std::string status(uint32_t code) {
        unsigned char b[8];
        mcrs::encode_samehost_status(code, b);
        return std::string(reinterpret_cast<char *>(b), 8);
    }
};

}  // namespace shtest
