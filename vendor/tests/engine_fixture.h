// Shared helpers for tests that run real engines on 127.0.0.1.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_ext.h"
#include "test_util.h"

namespace mctest {

struct EngineOptions {
    uint32_t progress_timeout_ms = 3000;
    uint32_t proto_version = 2;
    uint32_t lanes = 4;
    // The same-host path: off by default here, so that two engines of one
    // test process exercise TCP; test_same_host.cpp turns it on.
    bool same_host = false;
};

inline transfer_engine_t make_engine(const EngineOptions &o = {}) {
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.local_server_name = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.tcp_progress_timeout_ms = o.progress_timeout_ms;
    c.tcp_proto_version = o.proto_version;
    c.tcp_lanes_per_peer = o.lanes;
    c.handshake_timeout_ms = 3000;
    c.enable_same_host = o.same_host ? 1 : 0;
    transfer_engine_t e = mc_engine_create(&c);
    if (!e) std::fprintf(stderr, "mc_engine_create: %s\n", mc_last_error_message());
    return e;
}

inline std::string segment_name(transfer_engine_t e) {
    char buf[128];
    size_t n = 0;
    mc_engine_segment_name(e, buf, sizeof buf, &n);
    return std::string(buf);
}

inline uint16_t rpc_port(transfer_engine_t e) {
    uint16_t r = 0, t = 0;
    mc_engine_ports(e, &r, &t);
    return r;
}

inline uint16_t data_port(transfer_engine_t e) {
    uint16_t r = 0, t = 0;
    mc_engine_ports(e, &r, &t);
    return t;
}

// The engine's counters (zeroes if the call fails).
inline mc_engine_counters_t counters(transfer_engine_t e) {
    mc_engine_counters_t c{};
    mc_engine_get_counters(e, &c);
    return c;
}

// Submits `reqs` as one batch, waits, returns the statuses.
inline std::vector<int> run_batch(transfer_engine_t e, std::vector<transfer_request> reqs,
                                  int64_t timeout_ms = 20000) {
    batch_id_t b = allocateBatchID(e, reqs.size());
    std::vector<int> out;
    if (b == INVALID_BATCH) return out;
    int rc = submitTransfer(e, b, reqs.data(), reqs.size());
    if (rc != 0) {
        std::fprintf(stderr, "submitTransfer rc %d: %s\n", rc, mc_last_error_message());
        freeBatchID(e, b);
        return out;
    }
    if (mc_batch_wait(e, b, timeout_ms) != 0) {
        std::fprintf(stderr, "mc_batch_wait: %s\n", mc_last_error_message());
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
        transfer_status st{};
        getTransferStatus(e, b, i, &st);
        out.push_back(st.status);
    }
    freeBatchID(e, b);
    return out;
}

inline void fill_random(std::vector<char> &v, uint32_t seed) {
    std::mt19937 g(seed);
    for (auto &c : v) c = static_cast<char>(g());
}

// A raw TCP connection to 127.0.0.1:port for protocol-abuse tests.
struct RawConn {
    int fd = -1;
    explicit RawConn(uint16_t port) {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
            ::close(fd);
            fd = -1;
        }
        timeval tv{3, 0};
        if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    ~RawConn() {
        if (fd >= 0) ::close(fd);
    }
    bool send_bytes(const std::string &s) {
        return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
    }
    // Reads until EOF, error or `max` bytes; returns what arrived.
    std::string read_some(size_t max = 1 << 20) {
        std::string out;
        char buf[4096];
        while (out.size() < max) {
            ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            out.append(buf, static_cast<size_t>(n));
        }
        return out;
    }
};

inline std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
    return s;
}

}  // namespace mctest
