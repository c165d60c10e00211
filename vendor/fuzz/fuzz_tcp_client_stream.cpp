// The TCP initiator reading a hostile target: the engine (fuzz_engine.h)
// sends a batch of READs and WRITEs to a fake segment owner whose data port
// answers with the fuzz bytes (status frames, READ payloads, garbage,
// truncation), then closes. Input: byte 0 picks the request count n (1-8),
// the next 2n bytes each request's opcode (bit 0: WRITE) and length
// (1 + 8 * byte); the rest is the target's answer. Findings: any sanitizer
// report, a batch that does not finish, a byte of the local buffer outside
// every READ's destination changed, a guard page touched.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/socket.h"
#include "fuzz_engine.h"
#include "handshake/frame.h"
#include "handshake/handshake_server.h"

namespace {

constexpr uint64_t kRemoteAddr = 0x100000;  // the fake target's buffer

struct FakeTarget {
    std::unique_ptr<mcrs::HandshakeServer> handshake;
    mcrs::Fd data;
    segment_id_t segment = -1;
};

FakeTarget &target() {
    static FakeTarget t = [] {
        FakeTarget out;
        fuzz::Engine &e = fuzz::engine();
        std::string err;
        uint16_t rpc_port = 0, data_port = 0;
        mcrs::Fd rpc = mcrs::listen_tcp_random("127.0.0.1", 20000, 60000, 500, 64, rpc_port, err);
        FUZZ_CHECK(rpc.valid(), err.c_str());
        out.data = mcrs::listen_tcp_random("127.0.0.1", 20000, 60000, 500, 64, data_port, err);
        FUZZ_CHECK(out.data.valid(), err.c_str());
        mcrs::set_nonblocking(out.data.get(), true);
        std::string name = "127.0.0.1:" + std::to_string(rpc_port);
        // What an upstream TCP engine publishes: one big host buffer.
        mcrs::Json desc = mcrs::Json::parse(
            "{\"name\":\"" + name + "\",\"protocol\":\"tcp\",\"tcp_data_port\":" +
            std::to_string(data_port) +
            ",\"tcp_proto_version\":2,\"rdma_server_name\":\"\",\"buffers\":[{\"addr\":" +
            std::to_string(kRemoteAddr) + ",\"length\":1073741824,\"name\":\"cpu:0\"}]}");
        mcrs::HandshakeServerOptions ho;
        out.handshake = std::make_unique<mcrs::HandshakeServer>(
            std::move(rpc), ho, [desc](uint8_t type, const mcrs::Json &, mcrs::Json &reply) {
                if (type == mcrs::kHsMetadata) reply = desc;
                else if (type == mcrs::kHsProbe) reply.set("status", "success");
                else return false;
                return true;
            });
        out.handshake->start();
        out.segment = openSegment(e.engine, name.c_str());
        FUZZ_CHECK(out.segment >= 0, mc_last_error_message());
        return out;
    }();
    return t;
}

struct Peer {
    int fd;
    size_t sent = 0;
    bool wr_open = true;
    bool eof = false;  // the engine closed its end
};

// Waits for batch `b`, serving each connection the engine opens: `answer`,
// then FIN; what the engine sends is drained. Returns the connections.
std::vector<Peer> serve_until_done(transfer_engine_t engine, batch_id_t b, const uint8_t *answer,
                                   size_t answer_len) {
    FakeTarget &t = target();
    std::vector<Peer> peers;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (mc_batch_wait(engine, b, 0) != 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            std::fprintf(stderr, "the batch did not finish against a target that closed\n");
            std::abort();
        }
        std::vector<pollfd> pf;
        pf.push_back({t.data.get(), POLLIN, 0});
        for (const Peer &p : peers)
            pf.push_back({p.fd, static_cast<short>(POLLIN | (p.wr_open ? POLLOUT : 0)), 0});
        ::poll(pf.data(), pf.size(), 5);
        if (pf[0].revents & POLLIN) {
            int fd = ::accept4(t.data.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                linger lg{1, 0};
                ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
                peers.push_back({fd});
            }
        }
        for (Peer &p : peers) {
            char buf[65536];
            ssize_t k;
            while ((k = ::recv(p.fd, buf, sizeof buf, 0)) > 0) {
            }
            if (k == 0) p.eof = true;
            if (p.wr_open && p.sent < answer_len) {
                k = ::send(p.fd, answer + p.sent, answer_len - p.sent, MSG_NOSIGNAL);
                if (k > 0) p.sent += static_cast<size_t>(k);
                else if (k < 0 && errno != EAGAIN && errno != EINTR) p.wr_open = false;
            }
            if (p.wr_open && p.sent == answer_len) {
                ::shutdown(p.fd, SHUT_WR);
                p.wr_open = false;
            }
        }
    }
    return peers;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t n = 1 + data[0] % 8;
    if (size < 1 + 2 * n) return 0;
    fuzz::Engine &e = fuzz::engine();
    FakeTarget &t = target();
    unsigned char *local = fuzz::remote_buf();
    for (size_t i = 0; i < fuzz::kRemoteLen; ++i) local[i] = static_cast<unsigned char>(i * 7);
    std::vector<transfer_request> reqs(n);
    std::vector<bool> dest(fuzz::kRemoteLen, false);  // bytes a READ may fill
    for (size_t i = 0; i < n; ++i) {
        bool write = data[1 + 2 * i] & 1;
        uint64_t len = 1 + 8 * uint64_t(data[2 + 2 * i]);
        // The last request ends at the guard page after the buffer.
        size_t off = i + 1 == n ? fuzz::kRemoteLen - len : i * 4096;
        reqs[i] = {write ? OPCODE_WRITE : OPCODE_READ, local + off, t.segment, kRemoteAddr + i * 4096, len};
        if (!write)
            for (size_t k = 0; k < len; ++k) dest[off + k] = true;
    }
    const uint8_t *answer = data + 1 + 2 * n;
    const size_t answer_len = size - 1 - 2 * n;

    batch_id_t b = allocateBatchID(e.engine, n);
    FUZZ_CHECK(b != INVALID_BATCH, mc_last_error_message());
    FUZZ_CHECK(submitTransfer(e.engine, b, reqs.data(), n) == 0, mc_last_error_message());
    std::vector<Peer> peers = serve_until_done(e.engine, b, answer, answer_len);
    bool stale = false;
    for (Peer &p : peers) {
        stale = stale || !p.eof;
        ::close(p.fd);
    }
    if (std::getenv("MC_FUZZ_LOG")) {
        std::fprintf(stderr, "%zu connection(s)\n", peers.size());
        for (size_t i = 0; i < n; ++i) {
            transfer_status st{};
            char why[512] = "";
            size_t need = 0;
            getTransferStatus(e.engine, b, i, &st);
            mc_transfer_error(e.engine, b, i, why, sizeof why, &need);
            std::fprintf(stderr, "task %zu: status %d %s\n", i, st.status, why);
        }
    }
    freeBatchID(e.engine, b);
    if (stale) {
        // The engine still pools the connection we closed: a throw-away
        // READ makes it find out now, so the next input starts afresh.
        transfer_request r{OPCODE_READ, local, t.segment, kRemoteAddr, 1};
        dest[0] = true;
        b = allocateBatchID(e.engine, 1);
        FUZZ_CHECK(b != INVALID_BATCH, mc_last_error_message());
        FUZZ_CHECK(submitTransfer(e.engine, b, &r, 1) == 0, mc_last_error_message());
        for (Peer &p : serve_until_done(e.engine, b, nullptr, 0)) ::close(p.fd);
        freeBatchID(e.engine, b);
    }
    for (size_t i = 0; i < fuzz::kRemoteLen; ++i)
        if (!dest[i] && local[i] != static_cast<unsigned char>(i * 7)) {
            std::fprintf(stderr, "local byte %zu, outside every READ destination, changed\n", i);
            std::abort();
        }
    fuzz::check_canaries();
    return 0;
}
