// The same-host CPU path (cross-memory attach, tcp_wire.h): transfers and
// counters, the switches on either side, the owner's checks against its live
// registry (stale descriptors, ranges outside every buffer), the process
// proof with raw connections (forged or missing proofs are refused and the
// session stays plain TCP), the descriptor keys, and batch reuse.
#include <atomic>
#include <thread>

#include "engine/segment_descriptor.h"
#include "engine_fixture.h"
#include "transport/tcp/tcp_wire.h"

using namespace mctest;

namespace {

bool contains(const std::string &s, const char *needle) { return s.find(needle) != std::string::npos; }

EngineOptions same_host(bool on = true) {
    EngineOptions o;
    o.same_host = on;
    return o;
}

struct Pair {
    transfer_engine_t target = nullptr;
    transfer_engine_t init = nullptr;
    std::vector<char> tmem, imem;
    segment_id_t seg = -1;

    Pair(size_t bytes, EngineOptions to, EngineOptions io) : tmem(bytes), imem(bytes) {
        target = make_engine(to);
        init = make_engine(io);
        REQUIRE(target && init);
        REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
        REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "cpu:0", 0), 0);
        seg = openSegment(init, segment_name(target).c_str());
        REQUIRE(seg > 0);
    }
    ~Pair() {
        destroyTransferEngine(init);
        destroyTransferEngine(target);
    }
    uint64_t taddr(size_t off) const { return reinterpret_cast<uint64_t>(tmem.data()) + off; }
    transfer_request req(int op, size_t local_off, size_t remote_off, size_t len) {
        return transfer_request{op, imem.data() + local_off, seg, taddr(remote_off), len};
    }
    mc_engine_counters_t counters(transfer_engine_t e) {
        mc_engine_counters_t c{};
        mc_engine_get_counters(e, &c);
        return c;
    }
};

std::string error_of(transfer_engine_t e, batch_id_t b, size_t task) {
    char why[1024];
    size_t need = 0;
    if (mc_transfer_error(e, b, task, why, sizeof why, &need) != 0) return "";
    return why;
}

}  // namespace

TEST(same_host_transfers_move_every_byte_without_tcp_payload) {
    const size_t kMax = 16u << 20;
    Pair p(kMax + 8192, same_host(), same_host());
    fill_random(p.tmem, 7);
    const size_t sizes[] = {1, 4096, 65537, (1u << 20) + 3, kMax};
    size_t n = 0;
    for (size_t sz : sizes) {
        std::memset(p.imem.data(), 0x5A, sz + 1);
        auto st = run_batch(p.init, {p.req(OPCODE_READ, 0, 5, sz)});
        REQUIRE_EQ(st.size(), 1u);
        CHECK_EQ(st[0], STATUS_COMPLETED);
        CHECK(std::memcmp(p.imem.data(), p.tmem.data() + 5, sz) == 0);
        CHECK_EQ(p.imem[sz], static_cast<char>(0x5A));
        std::vector<char> src(sz);
        fill_random(src, static_cast<uint32_t>(sz) + 1);
        std::memcpy(p.imem.data(), src.data(), sz);
        char guard = p.tmem[sz + 100];
        st = run_batch(p.init, {p.req(OPCODE_WRITE, 0, 100, sz)});
        CHECK_EQ(st[0], STATUS_COMPLETED);
        CHECK(std::memcmp(p.tmem.data() + 100, src.data(), sz) == 0);
        CHECK_EQ(p.tmem[sz + 100], guard);
        n += 2;
    }
    // A batch of 256 scattered requests, READs and WRITEs mixed.
    std::vector<transfer_request> reqs;
    for (size_t i = 0; i < 256; ++i)
        reqs.push_back(p.req(i % 2 ? OPCODE_WRITE : OPCODE_READ, i * 4096, (255 - i) * 4096, 4096));
    auto st = run_batch(p.init, reqs);
    for (int s : st) CHECK_EQ(s, STATUS_COMPLETED);
    n += 256;
    auto ci = p.counters(p.init), ct = p.counters(p.target);
    CHECK_EQ(ci.same_host_requests, static_cast<uint64_t>(n));
    CHECK_EQ(ci.tcp_requests_sent, 0u);
    CHECK_EQ(ct.same_host_served, static_cast<uint64_t>(n));
    CHECK_EQ(ct.tcp_requests_served, 0u);
}

TEST(same_host_switched_off_on_either_side_uses_tcp) {
    for (int side = 0; side < 2; ++side) {
        Pair p(1 << 20, same_host(side != 0), same_host(side == 0));
        fill_random(p.tmem, 3);
        auto st = run_batch(p.init, {p.req(OPCODE_READ, 0, 0, 65536), p.req(OPCODE_WRITE, 65536, 65536, 65536)});
        CHECK_EQ(st[0], STATUS_COMPLETED);
        CHECK_EQ(st[1], STATUS_COMPLETED);
        CHECK(std::memcmp(p.imem.data(), p.tmem.data(), 65536) == 0);
        auto ci = p.counters(p.init);
        CHECK_EQ(ci.same_host_requests, 0u);
        CHECK_EQ(ci.tcp_requests_sent, 2u);
    }
}

TEST(same_host_owner_rejects_a_stale_descriptor) {
    // The initiator caches a descriptor that lists `other`; the owner
    // unregisters it afterwards. The owner checks its live registry before
    // it copies, so nothing is written and nothing is read.
    transfer_engine_t t = make_engine(same_host()), i = make_engine(same_host());
    REQUIRE(t && i);
    std::vector<char> keep(1 << 16, 'k'), other(1 << 16, 'o'), local(1 << 16, 'w');
    REQUIRE_EQ(registerLocalMemory(t, keep.data(), keep.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(t, other.data(), other.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(i, local.data(), local.size(), "cpu:0", 1), 0);
    segment_id_t seg = openSegment(i, segment_name(t).c_str());
    REQUIRE(seg > 0);
    REQUIRE_EQ(unregisterLocalMemory(t, other.data()), 0);
    batch_id_t b = allocateBatchID(i, 2);
    transfer_request r[2] = {
        {OPCODE_WRITE, local.data(), seg, reinterpret_cast<uint64_t>(other.data()), 4096},
        {OPCODE_READ, local.data(), seg, reinterpret_cast<uint64_t>(other.data()) + 8192, 4096},
    };
    REQUIRE_EQ(submitTransfer(i, b, r, 2), 0);
    REQUIRE_EQ(mc_batch_wait(i, b, 10000), 0);
    transfer_status st{};
    getTransferStatus(i, b, 0, &st);
    CHECK_EQ(st.status, STATUS_FAILED);
    CHECK(contains(error_of(i, b, 0), "rejected"));
    getTransferStatus(i, b, 1, &st);
    CHECK_EQ(st.status, STATUS_FAILED);
    freeBatchID(i, b);
    for (char c : other) REQUIRE_EQ(c, 'o');
    for (char c : local) REQUIRE_EQ(c, 'w');
    mc_engine_counters_t ci{}, ct{};
    mc_engine_get_counters(i, &ci);
    CHECK(ci.same_host_requests >= 1u);  // it went the same-host way
    // The engine goes on with good requests (on a new lane).
    auto ok = run_batch(i, {transfer_request{OPCODE_READ, local.data(), seg,
                                             reinterpret_cast<uint64_t>(keep.data()), 4096}});
    CHECK_EQ(ok[0], STATUS_COMPLETED);
    CHECK_EQ(local[0], 'k');
    mc_engine_get_counters(t, &ct);
    CHECK(ct.tcp_requests_rejected >= 1u);
    destroyTransferEngine(i);
    destroyTransferEngine(t);
}

TEST(same_host_ranges_outside_the_descriptor_go_to_tcp_and_fail) {
    Pair p(1 << 20, same_host(), same_host());
    std::vector<char> secret(8192, 's');
    REQUIRE_EQ(registerLocalMemory(p.target, secret.data(), secret.size(), "cpu:0", 0), 0);  // local only
    struct {
        int op;
        uint64_t addr;
        uint64_t len;
    } cases[] = {
        {OPCODE_READ, p.taddr(p.tmem.size() - 8), 16},  // crosses the end
        {OPCODE_WRITE, reinterpret_cast<uint64_t>(secret.data()), 16},  // not published
        {OPCODE_READ, 0x10, 8},
    };
    for (const auto &c : cases) {
        batch_id_t b = allocateBatchID(p.init, 1);
        transfer_request r{c.op, p.imem.data(), p.seg, c.addr, c.len};
        REQUIRE_EQ(submitTransfer(p.init, b, &r, 1), 0);
        REQUIRE_EQ(mc_batch_wait(p.init, b, 10000), 0);
        transfer_status st{};
        getTransferStatus(p.init, b, 0, &st);
        CHECK_EQ(st.status, STATUS_FAILED);
        CHECK(contains(error_of(p.init, b, 0), "rejected"));
        freeBatchID(p.init, b);
    }
    for (char c : secret) REQUIRE_EQ(c, 's');
    CHECK_EQ(p.counters(p.init).same_host_requests, 0u);
}

namespace {

// A raw data connection speaking the same-host session by hand.
struct RawSession {
    RawConn c;
    unsigned char slot[mcrs::kCmaNonceLen] = {};
    explicit RawSession(uint16_t port) : c(port) {}

    // Exactly n bytes (fewer only at EOF or timeout).
    std::string read_exact(size_t n) {
        std::string out(n, '\0');
        size_t got = 0;
        while (got < n) {
            ssize_t k = ::recv(c.fd, &out[got], n - got, 0);
            if (k <= 0) break;
            got += static_cast<size_t>(k);
        }
        out.resize(got);
        return out;
    }

    bool hello(uint64_t pid, uint64_t slot_addr, std::string &nonce) {
        std::string h(mcrs::kTcpHeaderLen, '\0');
        h[0] = static_cast<char>(mcrs::kCmaHelloBodyLen);
        h[16] = static_cast<char>(mcrs::kTcpOpCmaHello);
        if (!c.send_bytes(h + le64(pid) + le64(slot_addr))) return false;
        std::string st = read_exact(8);
        if (st != status(0)) return false;
        nonce = read_exact(mcrs::kCmaNonceLen);
        return nonce.size() == mcrs::kCmaNonceLen;
    }
    std::string proof() {
        std::string h(mcrs::kTcpHeaderLen, '\0');
        h[16] = static_cast<char>(mcrs::kTcpOpCmaProof);
        c.send_bytes(h);
        return read_exact(8);
    }
    std::string cma(uint8_t op, uint64_t remote, uint64_t len, uint64_t local) {
        std::string h(mcrs::kTcpHeaderLen, '\0');
        std::memcpy(&h[0], le64(len).data(), 8);
        std::memcpy(&h[8], le64(remote).data(), 8);
        h[16] = static_cast<char>(op);
        c.send_bytes(h + le64(local));
        return read_exact(8);
    }
    static std::string status(uint32_t code) { return le64((uint64_t(mcrs::kTcpStatusMagic) << 32) | code); }
};

}  // namespace

TEST(same_host_proof_must_match_and_unverified_sessions_copy_nothing) {
    transfer_engine_t t = make_engine(same_host());
    REQUIRE(t);
    std::vector<char> mem(1 << 16, 't');
    REQUIRE_EQ(registerLocalMemory(t, mem.data(), mem.size(), "cpu:0", 1), 0);
    std::vector<char> mine(1 << 16, 'm');
    const uint64_t maddr = reinterpret_cast<uint64_t>(mine.data());
    const uint64_t taddr = reinterpret_cast<uint64_t>(mem.data());
    {
        // A claimed pid whose memory does not hold the nonce (the slot is
        // never filled): refused.
        RawSession s(data_port(t));
        std::string nonce;
        REQUIRE(s.hello(static_cast<uint64_t>(getpid()), reinterpret_cast<uint64_t>(s.slot), nonce));
        CHECK(s.proof() == RawSession::status(mcrs::kTcpStatusCmaRefused));
        // The session is not verified: a same-host READ is rejected and the
        // connection closed, and nothing was copied.
        CHECK(s.cma(mcrs::kTcpOpCmaRead, taddr, 64, maddr) == RawSession::status(mcrs::kTcpStatusRejected));
        CHECK(s.c.read_some().empty());
        for (char ch : mine) REQUIRE_EQ(ch, 'm');
    }
    {
        // Someone else's pid (init): its memory cannot hold our nonce.
        RawSession s(data_port(t));
        std::string nonce;
        REQUIRE(s.hello(1, reinterpret_cast<uint64_t>(s.slot), nonce));
        CHECK(s.proof() == RawSession::status(mcrs::kTcpStatusCmaRefused));
    }
    {
        // No hello at all.
        RawSession s(data_port(t));
        CHECK(s.cma(mcrs::kTcpOpCmaWrite, taddr, 64, maddr) == RawSession::status(mcrs::kTcpStatusRejected));
        for (char ch : mem) REQUIRE_EQ(ch, 't');
    }
    {
        // A real proof: the session copies, but only inside registered,
        // remote-accessible memory.
        RawSession s(data_port(t));
        std::string nonce;
        REQUIRE(s.hello(static_cast<uint64_t>(getpid()), reinterpret_cast<uint64_t>(s.slot), nonce));
        std::memcpy(s.slot, nonce.data(), sizeof s.slot);
        REQUIRE(s.proof() == RawSession::status(0));
        CHECK(s.cma(mcrs::kTcpOpCmaRead, taddr + 8, 1024, maddr) == RawSession::status(0));
        for (size_t i = 0; i < 1024; ++i) REQUIRE_EQ(mine[i], 't');
        CHECK_EQ(mine[1024], 'm');
        // A bad local address in the initiator: the copy fails alone, the
        // session goes on.
        CHECK(s.cma(mcrs::kTcpOpCmaWrite, taddr, 64, 0x10) == RawSession::status(mcrs::kTcpStatusCmaFailed));
        std::memset(mine.data(), 'W', 64);
        CHECK(s.cma(mcrs::kTcpOpCmaWrite, taddr, 64, maddr) == RawSession::status(0));
        CHECK_EQ(mem[0], 'W');
        CHECK_EQ(mem[64], 't');
        // Outside the registration: rejected, closed.
        CHECK(s.cma(mcrs::kTcpOpCmaRead, taddr + mem.size() - 8, 64, maddr) ==
              RawSession::status(mcrs::kTcpStatusRejected));
        CHECK(s.c.read_some().empty());
    }
    {
        // The target re-checks the proof: once the slot no longer holds the
        // nonce (the peer exec'd, or its pid now names another process),
        // the session copies nothing more.
        RawSession s(data_port(t));
        std::string nonce;
        REQUIRE(s.hello(static_cast<uint64_t>(getpid()), reinterpret_cast<uint64_t>(s.slot), nonce));
        std::memcpy(s.slot, nonce.data(), sizeof s.slot);
        REQUIRE(s.proof() == RawSession::status(0));
        std::memset(s.slot, 0, sizeof s.slot);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::memset(mine.data(), 'm', mine.size());
        CHECK(s.cma(mcrs::kTcpOpCmaRead, taddr, 64, maddr) == RawSession::status(mcrs::kTcpStatusRejected));
        CHECK_EQ(mine[0], 'm');
    }
    {
        // A target with the path off refuses the hello; plain TCP goes on.
        transfer_engine_t off = make_engine(same_host(false));
        REQUIRE(off);
        REQUIRE_EQ(registerLocalMemory(off, mem.data() + 4096, 4096, "cpu:0", 1), 0);
        RawSession s(data_port(off));
        std::string h(mcrs::kTcpHeaderLen, '\0');
        h[0] = static_cast<char>(mcrs::kCmaHelloBodyLen);
        h[16] = static_cast<char>(mcrs::kTcpOpCmaHello);
        REQUIRE(s.c.send_bytes(h + le64(static_cast<uint64_t>(getpid())) + le64(maddr)));
        CHECK(s.read_exact(8) == RawSession::status(mcrs::kTcpStatusCmaRefused));
        std::string rd(mcrs::kTcpHeaderLen, '\0');
        rd[0] = 16;
        std::memcpy(&rd[8], le64(taddr + 4096).data(), 8);
        rd[16] = static_cast<char>(0x80);
        REQUIRE(s.c.send_bytes(rd));
        std::string got = s.read_exact(24);
        CHECK(got == RawSession::status(0) + std::string(16, 't'));
        destroyTransferEngine(off);
    }
    destroyTransferEngine(t);
}

TEST(same_host_descriptor_keys_and_host_ranges) {
    using namespace mcrs;
    SegmentDesc d;
    d.name = "127.0.0.1:15000";
    d.protocol = "tcp";
    d.tcp_data_port = 15001;
    d.tcp_proto_version = 2;
    d.host_id = "boot@host";
    d.pid = 42;
    d.same_host = true;
    BufferDesc a, b, g;
    a.name = "cpu:0";
    a.addr = 0x20000;
    a.length = 0x1000;
    b.name = "cpu:0";
    b.addr = 0x10000;
    b.length = 0x1000;
    g.name = "cuda:0";
    g.addr = 0x40000;
    g.length = 0x1000;
    d.buffers = {a, b, g};
    Json j = encode_segment_desc(d);
    CHECK(j.dump().find("\"mc_cma\":1") != std::string::npos);
    SegmentDesc r = decode_segment_desc(j);
    CHECK(r.same_host);
    CHECK_EQ(r.host_ranges.size(), 2u);  // the GPU buffer is not a host range
    CHECK(r.in_host_buffer(0x10000, 0x1000));
    CHECK(r.in_host_buffer(0x20800, 0x800));
    CHECK(!r.in_host_buffer(0x10800, 0x1000));  // crosses the end
    CHECK(!r.in_host_buffer(0x18000, 8));        // between buffers
    CHECK(!r.in_host_buffer(0x40000, 8));        // GPU
    CHECK(!r.in_host_buffer(0xFFFF, 2));
    CHECK(!r.in_host_buffer(UINT64_MAX - 4, 8));  // wraps
    // Upstream descriptors have no such key; a bad value is not "on".
    Json up = Json::parse(
        "{\"buffers\":[],\"name\":\"127.0.0.1:1\",\"protocol\":\"tcp\",\"tcp_data_port\":2}");
    CHECK(!decode_segment_desc(up).same_host);
    Json odd = Json::parse(
        "{\"buffers\":[],\"name\":\"127.0.0.1:1\",\"protocol\":\"tcp\",\"mc_cma\":\"yes\"}");
    CHECK(!decode_segment_desc(odd).same_host);
}

TEST(batch_reset_reuses_a_batch_and_refuses_unseen_tasks) {
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    std::vector<char> a(1 << 16, 'a'), b(1 << 16, 'b');
    REQUIRE_EQ(registerLocalMemory(e, a.data(), a.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(e, b.data(), b.size(), "cpu:0", 1), 0);
    batch_id_t id = allocateBatchID(e, 4);
    REQUIRE(id != INVALID_BATCH);
    for (int round = 0; round < 100; ++round) {
        transfer_request r[4];
        for (int i = 0; i < 4; ++i)
            r[i] = {OPCODE_WRITE, a.data() + i * 64, LOCAL_SEGMENT,
                    reinterpret_cast<uint64_t>(b.data()) + round * 256 + i * 64, 64};
        REQUIRE_EQ(submitTransfer(e, id, r, 4), 0);
        // Local copies finish inside submit, but nobody has seen them yet.
        if (round == 0) CHECK_EQ(mc_batch_reset(e, id), MC_STATUS_BATCH_BUSY);
        REQUIRE_EQ(mc_batch_wait(e, id, 10000), 0);
        REQUIRE_EQ(mc_batch_reset(e, id), 0);
    }
    CHECK_EQ(b[0], 'a');
    CHECK_EQ(b[100 * 256 - 1], 'a');
    CHECK_EQ(b[100 * 256], 'b');
    // A reset batch is empty: it holds its capacity again, and frees.
    transfer_request five[5];
    for (auto &r : five) r = {OPCODE_WRITE, a.data(), LOCAL_SEGMENT, reinterpret_cast<uint64_t>(b.data()), 8};
    CHECK_EQ(submitTransfer(e, id, five, 5), MC_STATUS_TOO_MANY_REQUESTS);
    CHECK_EQ(freeBatchID(e, id), 0);
    CHECK_EQ(mc_batch_reset(e, id), MC_STATUS_INVALID_ARGUMENT);
    destroyTransferEngine(e);
}
