// Bad input from the caller and from peers: each gets a clear error, and the
// engine keeps serving other work afterwards.
#include <algorithm>
#include <atomic>
#include <thread>

#include "engine_fixture.h"

using namespace mctest;

namespace {

struct Setup {
    transfer_engine_t target = make_engine();
    transfer_engine_t init = make_engine();
    std::vector<char> tmem = std::vector<char>(1 << 20);
    std::vector<char> imem = std::vector<char>(1 << 20);
    segment_id_t seg = -1;
    Setup() {
        REQUIRE(target && init);
        fill_random(tmem, 99);
        REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "*", 1), 0);
        REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "*", 1), 0);
        seg = openSegment(init, segment_name(target).c_str());
        REQUIRE(seg > 0);
    }
    ~Setup() {
        destroyTransferEngine(init);
        destroyTransferEngine(target);
    }
    uint64_t taddr(size_t off) const { return reinterpret_cast<uint64_t>(tmem.data()) + off; }
    // A good transfer: proves the engines still serve.
    bool still_serving() {
        std::memset(imem.data(), 0, 4096);
        auto st = run_batch(init, {transfer_request{OPCODE_READ, imem.data(), seg, taddr(0), 4096}});
        return st.size() == 1 && st[0] == STATUS_COMPLETED &&
               std::memcmp(imem.data(), tmem.data(), 4096) == 0;
    }
    std::string submit_error(std::vector<transfer_request> reqs, int expect) {
        batch_id_t b = allocateBatchID(init, 4);
        int rc = submitTransfer(init, b, reqs.data(), reqs.size());
        std::string msg = mc_last_error_message();
        if (rc != expect)
            mctest::record_failure(__FILE__, __LINE__,
                                   "submit rc " + std::to_string(rc) + " expected " +
                                       std::to_string(expect) + ": " + msg);
        freeBatchID(init, b);
        return msg;
    }
};

bool contains(const std::string &s, const char *needle) { return s.find(needle) != std::string::npos; }

}  // namespace

TEST(bad_registration_overlap_and_unregistered) {
    Setup s;
    CHECK_EQ(registerLocalMemory(s.init, s.imem.data() + 10, 100, "*", 1), ERR_ADDRESS_OVERLAPPED);
    CHECK(contains(mc_last_error_message(), "overlaps"));
    CHECK_EQ(registerLocalMemory(s.init, s.imem.data(), 0, "*", 1), ERR_INVALID_ARGUMENT);
    CHECK_EQ(unregisterLocalMemory(s.init, s.imem.data() + 1), ERR_ADDRESS_NOT_REGISTERED);
    std::vector<char> stray(4096);
    std::string m = s.submit_error(
        {transfer_request{OPCODE_READ, stray.data(), s.seg, s.taddr(0), 16}}, MC_STATUS_ADDRESS_NOT_REGISTERED);
    CHECK(contains(m, "not inside one registered buffer"));
    // A request running past the end of the local registration.
    s.submit_error({transfer_request{OPCODE_READ, s.imem.data() + s.imem.size() - 8, s.seg, s.taddr(0), 16}},
                   MC_STATUS_ADDRESS_NOT_REGISTERED);
    CHECK(s.still_serving());
}

TEST(bad_requests_rejected_at_submit) {
    Setup s;
    std::string m = s.submit_error({transfer_request{OPCODE_READ, s.imem.data(), s.seg, s.taddr(0), 0}},
                                   MC_STATUS_INVALID_ARGUMENT);
    CHECK(contains(m, "length is zero"));
    m = s.submit_error({transfer_request{7, s.imem.data(), s.seg, s.taddr(0), 8}}, MC_STATUS_INVALID_ARGUMENT);
    CHECK(contains(m, "opcode"));
    m = s.submit_error({transfer_request{OPCODE_READ, s.imem.data(), 4242, s.taddr(0), 8}},
                       MC_STATUS_INVALID_ARGUMENT);
    CHECK(contains(m, "unknown segment id"));
    m = s.submit_error({transfer_request{OPCODE_READ, s.imem.data(), s.seg, UINT64_MAX - 2, 8}},
                       MC_STATUS_INVALID_ARGUMENT);
    CHECK(contains(m, "wraps"));
    // Unknown batch ids (never allocated, or freed) are errors, not UB.
    transfer_request r{OPCODE_READ, s.imem.data(), s.seg, s.taddr(0), 8};
    CHECK_EQ(submitTransfer(s.init, 987654321, &r, 1), MC_STATUS_INVALID_ARGUMENT);
    batch_id_t b = allocateBatchID(s.init, 1);
    CHECK_EQ(freeBatchID(s.init, b), 0);
    CHECK_EQ(submitTransfer(s.init, b, &r, 1), MC_STATUS_INVALID_ARGUMENT);
    transfer_status st{};
    CHECK_EQ(getTransferStatus(s.init, b, 0, &st), MC_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(freeBatchID(s.init, b), MC_STATUS_INVALID_ARGUMENT);
    {
        // Capacity 0 is an empty batch, as upstream: a submit does not fit.
        batch_id_t z = allocateBatchID(s.init, 0);
        CHECK(z != INVALID_BATCH);
        transfer_request one{OPCODE_READ, s.imem.data(), s.seg, s.taddr(0), 8};
        CHECK_EQ(submitTransfer(s.init, z, &one, 1), MC_STATUS_TOO_MANY_REQUESTS);
        CHECK_EQ(submitTransfer(s.init, z, nullptr, 0), 0);
        CHECK_EQ(freeBatchID(s.init, z), 0);
    }
    CHECK(s.still_serving());
}

TEST(bad_full_batch_and_busy_free) {
    Setup s;
    batch_id_t b = allocateBatchID(s.init, 2);
    std::vector<transfer_request> three;
    for (size_t i = 0; i < 3; ++i)  // distinct destinations: no two lanes write the same bytes
        three.push_back(transfer_request{OPCODE_READ, s.imem.data() + i * 64, s.seg, s.taddr(0), 64});
    CHECK_EQ(submitTransfer(s.init, b, three.data(), 3), MC_STATUS_TOO_MANY_REQUESTS);
    CHECK(contains(mc_last_error_message(), "do not fit"));
    CHECK_EQ(submitTransfer(s.init, b, three.data(), 2), 0);
    CHECK_EQ(submitTransfer(s.init, b, three.data(), 1), MC_STATUS_TOO_MANY_REQUESTS);
    transfer_status st{};
    CHECK_EQ(getTransferStatus(s.init, b, 5, &st), MC_STATUS_INVALID_ARGUMENT);
    // Not every task observed terminal yet: BatchBusy, batch kept.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_EQ(freeBatchID(s.init, b), MC_STATUS_BATCH_BUSY);
    CHECK_EQ(mc_batch_wait(s.init, b, 10000), 0);
    CHECK_EQ(freeBatchID(s.init, b), 0);
    CHECK(s.still_serving());
}

TEST(bad_remote_range_fails_cleanly) {
    Setup s;
    struct Case {
        int op;
        uint64_t addr;
        uint64_t len;
    } cases[] = {
        {OPCODE_READ, s.taddr(s.tmem.size() - 8), 16},  // crosses the end
        {OPCODE_WRITE, s.taddr(s.tmem.size() - 8), 16},
        {OPCODE_READ, 0x10, 8},                          // arbitrary address (#2313)
        {OPCODE_WRITE, 0x10, 8},
        {OPCODE_READ, reinterpret_cast<uint64_t>(s.imem.data()), 8},  // the initiator's own memory
        {OPCODE_WRITE, s.taddr(0), (64u << 20)},         // oversized (local range is checked first)
    };
    for (const auto &c : cases) {
        uint64_t len = c.len;
        if (len > s.imem.size()) {
            // An oversized request is refused before the wire: the local
            // registration is only 1 MiB.
            transfer_request r{c.op, s.imem.data(), s.seg, c.addr, len};
            s.submit_error({r}, MC_STATUS_ADDRESS_NOT_REGISTERED);
            continue;
        }
        batch_id_t b = allocateBatchID(s.init, 1);
        transfer_request r{c.op, s.imem.data(), s.seg, c.addr, len};
        REQUIRE_EQ(submitTransfer(s.init, b, &r, 1), 0);
        REQUIRE_EQ(mc_batch_wait(s.init, b, 10000), 0);
        transfer_status st{};
        getTransferStatus(s.init, b, 0, &st);
        CHECK_EQ(st.status, STATUS_FAILED);
        CHECK_EQ(st.transferred_bytes, 0u);
        char why[512];
        size_t need = 0;
        CHECK_EQ(mc_transfer_error(s.init, b, 0, why, sizeof why, &need), 0);
        CHECK(contains(why, "rejected"));
        freeBatchID(s.init, b);
        CHECK(s.still_serving());
    }
    // The target's memory was never written by the rejected WRITEs.
    std::vector<char> again(s.tmem.size());
    fill_random(again, 99);
    CHECK(std::memcmp(again.data(), s.tmem.data(), again.size()) == 0);
}

// A rejected request ends its TCP connection, but only it fails: the
// target served nothing behind it, so those requests go out again on
// another connection and complete (a batch is not lost to one bad range).
TEST(bad_remote_range_in_a_pipeline_fails_only_its_request) {
    Setup s;
    const size_t kReq = 256, kLen = 2048;  // one lane's run: all pipelined on one connection
    const size_t bad[] = {5, 100, 101, 200};
    std::vector<transfer_request> reqs(kReq);
    std::memset(s.imem.data(), 0, s.imem.size());
    for (size_t i = 0; i < kReq; ++i) {
        const bool write = i % 2 == 1;
        char *local = s.imem.data() + i * kLen;
        if (write) std::memset(local, static_cast<int>('a' + i % 26), kLen);
        // WRITEs land in the upper half of the target's buffer.
        reqs[i] = transfer_request{write ? OPCODE_WRITE : OPCODE_READ, local, s.seg,
                                   s.taddr((write ? s.tmem.size() / 2 : 0) + i * kLen), kLen};
    }
    reqs[5].target_offset = s.taddr(s.tmem.size() - 8);                    // READ crossing the end
    reqs[100].target_offset = 0x10;                                        // READ of nothing
    reqs[101].target_offset = reinterpret_cast<uint64_t>(s.imem.data());  // WRITE into local-only memory
    reqs[200].target_offset = s.taddr(s.tmem.size());                      // READ just past the end
    batch_id_t b = allocateBatchID(s.init, kReq);
    REQUIRE_EQ(submitTransfer(s.init, b, reqs.data(), kReq), 0);
    REQUIRE_EQ(mc_batch_wait(s.init, b, 20000), 0);
    std::vector<char> pattern(s.tmem.size());
    fill_random(pattern, 99);
    size_t failed = 0;
    for (size_t i = 0; i < kReq; ++i) {
        transfer_status st{};
        REQUIRE_EQ(getTransferStatus(s.init, b, i, &st), 0);
        const bool is_bad = std::find(std::begin(bad), std::end(bad), i) != std::end(bad);
        if (is_bad) {
            ++failed;
            CHECK_EQ(st.status, STATUS_FAILED);
            char why[512];
            size_t need = 0;
            CHECK_EQ(mc_transfer_error(s.init, b, i, why, sizeof why, &need), 0);
            CHECK(contains(why, "peer rejected it"));
            continue;
        }
        CHECK_EQ(st.status, STATUS_COMPLETED);
        if (reqs[i].opcode == OPCODE_READ) {
            CHECK(std::memcmp(s.imem.data() + i * kLen, pattern.data() + i * kLen, kLen) == 0);
        } else {
            std::vector<char> want(kLen, static_cast<char>('a' + i % 26));
            CHECK(std::memcmp(s.tmem.data() + s.tmem.size() / 2 + i * kLen, want.data(), kLen) == 0);
        }
    }
    CHECK_EQ(failed, 4u);
    CHECK_EQ(counters(s.target).tcp_requests_rejected, 4u);
    CHECK_EQ(freeBatchID(s.init, b), 0);
    CHECK(s.still_serving());
}

TEST(bad_unknown_and_unreachable_segments) {
    Setup s;
    CHECK_EQ(openSegment(s.init, ""), -1);
    CHECK(contains(mc_last_error_message(), "empty"));
    // A port nobody listens on (our own data port is not a handshake port).
    std::string name = "127.0.0.1:" + std::to_string(data_port(s.init));
    CHECK_EQ(openSegment(s.init, name.c_str()), -1);
    CHECK(std::string(mc_last_error_message()).size() > 10);
    // An empty host fails name resolution without any DNS traffic.
    CHECK_EQ(openSegment(s.init, ":15000"), -1);
    CHECK_EQ(mc_last_error_code(), ERR_DNS);
    CHECK(s.still_serving());
}

TEST(bad_handshake_frames) {
    Setup s;
    uint16_t port = rpc_port(s.target);
    {  // length 0
        RawConn c(port);
        c.send_bytes(le64(0));
        CHECK(c.read_some().empty());
    }
    {  // length above the limit
        RawConn c(port);
        c.send_bytes(le64(2u << 20) + "\x01{}");
        CHECK(c.read_some().empty());
    }
    {  // unknown type byte: legacy framing, bad JSON, no reply
        RawConn c(port);
        c.send_bytes(le64(3) + std::string("\x04{}", 3));
        CHECK(c.read_some().empty());
    }
    {  // garbage JSON
        RawConn c(port);
        c.send_bytes(le64(9) + std::string("\x01not json"));
        CHECK(c.read_some().empty());
    }
    {  // random bytes
        RawConn c(port);
        std::vector<char> junk(5000);
        fill_random(junk, 5);
        c.send_bytes(std::string(junk.begin(), junk.end()));
        c.read_some(64);
    }
    {  // truncated frame, then close
        RawConn c(port);
        c.send_bytes(le64(100) + "\x01{\"a\"");
    }
    {  // a valid probe still works on a raw connection
        RawConn c(port);
        c.send_bytes(le64(4) + std::string("\x03{}\n"));
        std::string r = c.read_some();
        REQUIRE(r.size() > 9);
        CHECK_EQ(static_cast<int>(r[8]), 3);
        CHECK(contains(r, "\"status\":\"success\""));
    }
    {  // legacy framing is answered without a type byte
        RawConn c(port);
        std::string body = "{\"local_nic_path\":\"x@y\"}";
        c.send_bytes(le64(body.size()) + body);
        std::string r = c.read_some();
        REQUIRE(r.size() > 9);
        CHECK_EQ(r[8], '{');
        CHECK(contains(r, "\"qp_num\":[]"));
    }
    CHECK_EQ(mc_segment_probe(s.init, s.seg), 0);
    CHECK(s.still_serving());
}

TEST(bad_silent_handshake_client_does_not_stall_others) {
    Setup s;
    uint16_t port = rpc_port(s.target);
    // Several clients connect and say nothing (or only half a header).
    std::vector<std::unique_ptr<RawConn>> silent;
    for (int i = 0; i < 8; ++i) silent.push_back(std::make_unique<RawConn>(port));
    silent[0]->send_bytes(std::string("\x10\x00", 2));
    auto t0 = std::chrono::steady_clock::now();
    CHECK_EQ(mc_segment_probe(s.init, s.seg), 0);
    CHECK_EQ(openSegmentNoCache(s.init, segment_name(s.target).c_str()), s.seg);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                  .count();
    // Upstream's serial listener would take 5 s per silent client here.
    CHECK(ms < 1000);
}

TEST(bad_data_port_garbage) {
    Setup s;
    uint16_t port = data_port(s.target);
    {  // a header asking for 2^63 bytes at address 1
        RawConn c(port);
        c.send_bytes(le64(1ull << 63) + le64(1) + std::string(8, '\x80'));
        std::string r = c.read_some();
        REQUIRE_EQ(r.size(), 8u);
        CHECK_EQ(static_cast<int>(r[0]), 1);  // rejected
    }
    {  // random bytes
        RawConn c(port);
        std::vector<char> junk(100000);
        fill_random(junk, 8);
        c.send_bytes(std::string(junk.begin(), junk.end()));
        c.read_some(1024);
    }
    {  // pipelined valid requests on one raw connection, then an idle wait
        RawConn c(port);
        std::string req = le64(16) + le64(s.taddr(0)) + std::string(1, '\x80') + std::string(7, '\0');
        c.send_bytes(req + req);
        std::string r;
        char buf[64];
        while (r.size() < 48) {
            ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            r.append(buf, static_cast<size_t>(n));
        }
        REQUIRE_EQ(r.size(), 48u);
        CHECK(std::memcmp(r.data() + 8, s.tmem.data(), 16) == 0);
        CHECK(std::memcmp(r.data() + 32, s.tmem.data(), 16) == 0);
        // The server keeps an idle connection open.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        c.send_bytes(req);
        ssize_t n = ::recv(c.fd, buf, 24, MSG_WAITALL);
        CHECK_EQ(n, 24);
    }
    CHECK(s.still_serving());
}

TEST(bad_peer_disappears_mid_transfer) {
    transfer_engine_t init = make_engine();
    transfer_engine_t target = make_engine();
    REQUIRE(init && target);
    std::vector<char> tmem(256u << 20), imem(256u << 20);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "*", 1), 0);
    REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "*", 1), 0);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    REQUIRE(seg > 0);
    std::vector<transfer_request> reqs;
    for (size_t i = 0; i < 64; ++i)
        reqs.push_back(transfer_request{i % 2 ? OPCODE_WRITE : OPCODE_READ, imem.data() + i * (4u << 20), seg,
                                        reinterpret_cast<uint64_t>(tmem.data()) + i * (4u << 20), 4u << 20});
    batch_id_t b = allocateBatchID(init, reqs.size());
    REQUIRE_EQ(submitTransfer(init, b, reqs.data(), reqs.size()), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    destroyTransferEngine(target);  // the peer goes away with requests in flight
    auto t0 = std::chrono::steady_clock::now();
    CHECK_EQ(mc_batch_wait(init, b, 15000), 0);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                  .count();
    CHECK(ms < 10000);
    size_t failed = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        transfer_status st{};
        getTransferStatus(init, b, i, &st);
        CHECK(st.status == STATUS_COMPLETED || st.status == STATUS_FAILED);
        if (st.status == STATUS_FAILED) ++failed;
    }
    CHECK(failed > 0);
    CHECK_EQ(freeBatchID(init, b), 0);
    // New transfers to the dead segment fail, they do not hang.
    auto st = run_batch(init, {transfer_request{OPCODE_READ, imem.data(), seg,
                                                reinterpret_cast<uint64_t>(tmem.data()), 64}});
    CHECK_EQ(st[0], STATUS_FAILED);
    destroyTransferEngine(init);
}

TEST(bad_silent_data_peer_times_out) {
    // A data server that accepts and never answers: the progress timeout
    // ends the transfer as FAILED.
    int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    REQUIRE(::listen(lfd, 16) == 0);
    socklen_t al = sizeof a;
    getsockname(lfd, reinterpret_cast<sockaddr *>(&a), &al);
    uint16_t silent_port = ntohs(a.sin_port);

    // A fake handshake peer that advertises the silent data port.
    transfer_engine_t fake = make_engine();
    (void)fake;
    EngineOptions o;
    o.progress_timeout_ms = 1000;
    transfer_engine_t init = make_engine(o);
    std::vector<char> imem(4096);
    REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "*", 1), 0);
    // Serve one metadata request by hand on a raw listener.
    int hfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in h{};
    h.sin_family = AF_INET;
    h.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(hfd, reinterpret_cast<sockaddr *>(&h), sizeof h) == 0);
    REQUIRE(::listen(hfd, 4) == 0);
    socklen_t hl = sizeof h;
    getsockname(hfd, reinterpret_cast<sockaddr *>(&h), &hl);
    uint16_t hport = ntohs(h.sin_port);
    std::thread server([&] {
        int c = ::accept(hfd, nullptr, nullptr);
        char buf[4096];
        ::recv(c, buf, sizeof buf, 0);
        std::string desc = "{\"name\":\"127.0.0.1:" + std::to_string(hport) +
                           "\",\"protocol\":\"tcp\",\"tcp_data_host\":\"127.0.0.1\",\"tcp_data_port\":" +
                           std::to_string(silent_port) +
                           ",\"tcp_proto_version\":2,\"buffers\":[{\"addr\":4096,\"length\":4096,\"name\":\"cpu:0\"}]}";
        std::string f = le64(desc.size() + 1) + std::string(1, '\x01') + desc;
        ::send(c, f.data(), f.size(), MSG_NOSIGNAL);
        ::close(c);
    });
    std::string name = "127.0.0.1:" + std::to_string(hport);
    segment_id_t seg = openSegment(init, name.c_str());
    server.join();
    REQUIRE(seg > 0);
    auto t0 = std::chrono::steady_clock::now();
    auto st = run_batch(init, {transfer_request{OPCODE_READ, imem.data(), seg, 4096, 64}});
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                  .count();
    CHECK_EQ(st[0], STATUS_FAILED);
    CHECK(ms >= 900 && ms < 5000);
    destroyTransferEngine(init);
    destroyTransferEngine(fake);
    ::close(hfd);
    ::close(lfd);
}
