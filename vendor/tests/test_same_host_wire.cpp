// The same-host transport's wire edges: the TCP data port refuses the old
// pid-claiming hello; cma_copy_many against this process; descriptor keys;
// the request decoder's bounds; batch reuse. Shared helpers are in
// same_host_fixture.h, the two-process tests in test_same_host.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>

#include "core/segment_descriptor.h"
#include "same_host_fixture.h"
#include "transport/samehost/cma.h"
#include "transport/tcp/tcp_wire.h"

using namespace mctest;
using namespace shtest;

namespace {

// The retired same-host frames that rode on the TCP data port (HELLO with
// a claimed pid, PROOF, then CMA READ/WRITE with an initiator address):
// the attack the data port must refuse, spelled out here because the
// engine no longer knows them.
constexpr size_t kOldHelloBodyLen = 16;
constexpr size_t kOldNonceLen = 32;
constexpr uint8_t kOldOpHello = 0xC0;
constexpr uint8_t kOldOpProof = 0xC1;
constexpr uint8_t kOldOpRead = 0xC2;
constexpr uint8_t kOldOpWrite = 0xC3;

}  // namespace

TEST(tcp_data_port_refuses_the_old_same_host_hello) {
    // The attack the TCP lane allowed: claim the target's own pid in a
    // HELLO, with the proof slot inside a buffer the attacker may write;
    // write the nonce there over TCP; then ask for CMA copies of any
    // address. The data port must not know these opcodes at all.
    transfer_engine_t t = make_engine(same_host());
    REQUIRE(t);
    Guarded open(65536), secret(8192);
    std::memset(open.data(), 'o', open.size);
    std::memset(secret.data(), 's', secret.size);
    REQUIRE_EQ(registerLocalMemory(t, open.data(), open.size, "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(t, secret.data(), secret.size, "cpu:0", 0), 0);
    const uint64_t slot = open.addr() + 1024;  // remote-writable: the attacker's proof slot
    {
        RawConn c(data_port(t));
        REQUIRE(c.fd >= 0);
        std::string h(mcrs::kTcpHeaderLen, '\0');
        h[0] = static_cast<char>(kOldHelloBodyLen);
        h[16] = static_cast<char>(kOldOpHello);
        REQUIRE(c.send_bytes(h + le64(static_cast<uint64_t>(getpid())) + le64(slot)));
        std::string got = c.read_some(8 + kOldNonceLen);
        // Today: a READ of 16 bytes at address 0, rejected, closed.
        CHECK(got == le64(mcrs::encode_tcp_status(mcrs::kTcpStatusRejected)));
        CHECK(got.size() < 8 + kOldNonceLen);  // no nonce
        if (got.size() == 8 + kOldNonceLen) {
            // A server that hands out the nonce: finish the attack, to show
            // what it lets through. The nonce goes into the slot by a plain
            // TCP WRITE, the proof passes, and a CMA READ copies the secret
            // into the open buffer, where any TCP peer can read it.
            RawConn w(data_port(t));
            std::string wh(mcrs::kTcpHeaderLen, '\0');
            std::memcpy(&wh[0], le64(kOldNonceLen).data(), 8);
            std::memcpy(&wh[8], le64(slot).data(), 8);
            wh[16] = static_cast<char>(mcrs::kTcpOpWrite | mcrs::kTcpV2Flag);
            w.send_bytes(wh + got.substr(8));
            w.read_some(8);
            std::string ph(mcrs::kTcpHeaderLen, '\0');
            ph[16] = static_cast<char>(kOldOpProof);
            c.send_bytes(ph);
            std::string proof = c.read_some(8);
            // CMA WRITE: the target copies from "the initiator" (itself,
            // at the secret) into a registered buffer.
            std::string rh2(mcrs::kTcpHeaderLen, '\0');
            std::memcpy(&rh2[0], le64(64).data(), 8);
            std::memcpy(&rh2[8], le64(open.addr() + 8192).data(), 8);
            rh2[16] = static_cast<char>(kOldOpWrite);
            c.send_bytes(rh2 + le64(secret.addr()));
            std::fprintf(stderr, "    the old hello got a nonce; proof answer %zu bytes; CMA answer %zu bytes\n",
                         proof.size(), c.read_some(8).size());
        }
    }
    {
        // A CMA READ header naming the local-only secret: rejected, closed.
        RawConn c(data_port(t));
        REQUIRE(c.fd >= 0);
        std::string h(mcrs::kTcpHeaderLen, '\0');
        std::memcpy(&h[0], le64(64).data(), 8);
        std::memcpy(&h[8], le64(secret.addr()).data(), 8);
        h[16] = static_cast<char>(kOldOpRead);
        REQUIRE(c.send_bytes(h + le64(slot)));
        std::string got = c.read_some(64);
        CHECK(got == le64(mcrs::encode_tcp_status(mcrs::kTcpStatusRejected)));
    }
    for (size_t k = 0; k < secret.size; ++k) REQUIRE_EQ(secret.data()[k], 's');
    CHECK(std::memchr(open.data(), 's', open.size) == nullptr);  // no secret leaked
    for (size_t k = 0; k < open.size; ++k) REQUIRE_EQ(open.data()[k], 'o');
    CHECK(open.canaries_intact());
    CHECK(secret.canaries_intact());
    CHECK(counters(t).tcp_requests_rejected >= 2u);
    // A legit peer is still served.
    transfer_engine_t i = make_engine();
    REQUIRE(i);
    std::vector<char> mine(4096, 'm');
    REQUIRE_EQ(registerLocalMemory(i, mine.data(), mine.size(), "cpu:0", 0), 0);
    segment_id_t seg = openSegment(i, segment_name(t).c_str());
    REQUIRE(seg > 0);
    CHECK_EQ(one(i, OPCODE_READ, mine.data(), seg, open.addr(), 4096), STATUS_COMPLETED);
    CHECK_EQ(mine[0], 'o');
    CHECK_EQ(mine[4095], 'o');
    destroyTransferEngine(i);
    destroyTransferEngine(t);
}

// cma_copy_many against this process itself: a run of pieces goes in one
// call, a bad piece stops the run and says why, and pieces larger than one
// call's byte budget are still copied.
TEST(cma_copy_many_reports_the_first_bad_piece) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void *hole = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(hole != MAP_FAILED);
    const size_t n = 1500, len = 100;  // more pieces than one call takes
    std::vector<char> src(n * len), dst(n * len, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
    std::vector<mcrs::CmaPiece> pieces(n);
    for (size_t i = 0; i < n; ++i)
        pieces[i] = mcrs::CmaPiece{dst.data() + i * len, reinterpret_cast<uint64_t>(src.data() + i * len), len};
    int err = -1;
    CHECK_EQ(mcrs::cma_copy_many(::getpid(), false, pieces.data(), n, err), n);
    CHECK_EQ(err, 0);
    CHECK(dst == src);
    // A bad remote range at 1200: 0..1199 are copied, 1201.. are not tried.
    std::fill(dst.begin(), dst.end(), 0);
    pieces[1200].remote = reinterpret_cast<uint64_t>(hole);
    CHECK_EQ(mcrs::cma_copy_many(::getpid(), false, pieces.data(), n, err), 1200u);
    CHECK_EQ(err, EFAULT);
    CHECK(std::memcmp(dst.data(), src.data(), 1200 * len) == 0);
    CHECK_EQ(dst[1201 * len], 0);
    // The other direction: local -> "remote".
    std::fill(dst.begin(), dst.end(), 0);
    for (size_t i = 0; i < n; ++i)
        pieces[i] = mcrs::CmaPiece{src.data() + i * len, reinterpret_cast<uint64_t>(dst.data() + i * len), len};
    CHECK_EQ(mcrs::cma_copy_many(::getpid(), true, pieces.data(), n, err), n);
    CHECK(dst == src);
    // Scattered on one side, contiguous on the other (runs merge on the
    // contiguous side only): piece i goes to slot n-1-i.
    std::fill(dst.begin(), dst.end(), 0);
    for (size_t i = 0; i < n; ++i)
        pieces[i] = mcrs::CmaPiece{dst.data() + (n - 1 - i) * len, reinterpret_cast<uint64_t>(src.data() + i * len), len};
    pieces[700].remote = reinterpret_cast<uint64_t>(hole);
    CHECK_EQ(mcrs::cma_copy_many(::getpid(), false, pieces.data(), n, err), 700u);
    CHECK_EQ(err, EFAULT);
    for (size_t i = 0; i < 700; ++i) CHECK(std::memcmp(dst.data() + (n - 1 - i) * len, src.data() + i * len, len) == 0);
    CHECK_EQ(dst[(n - 1 - 700) * len], 0);
    munmap(hole, page);
}

TEST(same_host_descriptor_keys) {
    using namespace mcrs;
    {
        transfer_engine_t on = make_engine(same_host()), off = make_engine(same_host(false));
        REQUIRE(on && off);
        std::string jon = descriptor_json(on).dump(), joff = descriptor_json(off).dump();
        CHECK(!contains(jon, "mc_pid") && !contains(joff, "mc_pid"));
        CHECK(!contains(jon, "mc_cma") && !contains(joff, "mc_cma"));
        CHECK(contains(jon, "\"mc_same_host\":\"mooncake-"));
        CHECK(!contains(joff, "mc_same_host"));
        SegmentDesc d = decode_segment_desc(descriptor_json(on));
        CHECK_EQ(d.same_host_socket.size(), 9u + 32u);
        CHECK_EQ(d.process_token.size(), 32u);
        // One token per process, not per engine.
        CHECK_EQ(decode_segment_desc(descriptor_json(off)).process_token, d.process_token);
        destroyTransferEngine(off);
        destroyTransferEngine(on);
    }
    SegmentDesc d;
    d.name = "127.0.0.1:15000";
    d.protocol = "tcp";
    d.tcp_data_port = 15001;
    d.host_id = "boot@host";
    d.same_host_socket = "mooncake-0123456789abcdef0123456789abcdef";
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
    SegmentDesc r = decode_segment_desc(encode_segment_desc(d));
    CHECK_EQ(r.same_host_socket, d.same_host_socket);
    CHECK_EQ(r.host_ranges.size(), 2u);  // the GPU buffer is not a host range
    CHECK(r.in_host_buffer(0x10000, 0x1000));
    CHECK(!r.in_host_buffer(0x10800, 0x1000));    // crosses the end
    CHECK(!r.in_host_buffer(0x40000, 8));         // GPU
    CHECK(!r.in_host_buffer(UINT64_MAX - 4, 8));  // wraps
    const std::string head = R"({"buffers":[],"name":"127.0.0.1:1","protocol":"tcp","tcp_data_port":2)";
    CHECK(decode_segment_desc(Json::parse(head + "}")).same_host_socket.empty());
    for (const char *bad : {R"("mc_same_host":"")", R"("mc_same_host":"a b")", R"("mc_same_host":"x/../y")",
                            R"("mc_same_host":7)", R"("mc_same_host":"\u0000abc")", R"("mc_process":"zz")",
                            R"("mc_process":12)"}) {
        bool threw = false;
        try {
            decode_segment_desc(Json::parse(head + "," + bad + "}"));
        } catch (const Error &) {
            threw = true;
        }
        CHECK(threw);
    }
    bool threw = false;
    try {
        decode_segment_desc(Json::parse(head + R"(,"mc_same_host":")" + std::string(65, 'a') + "\"}"));
    } catch (const Error &) {
        threw = true;
    }
    CHECK(threw);
}

TEST(same_host_request_decoder_bounds_every_field) {
    using namespace mcrs;
    unsigned char b[kSameHostRequestLen];
    SameHostRequest r{kSameHostOpWrite, 0x1000, 4096, 0x2000}, out;
    std::string why;
    encode_samehost_request(r, b);
    REQUIRE(decode_samehost_request(b, sizeof b, out, why));
    CHECK_EQ(out.opcode, kSameHostOpWrite);
    CHECK_EQ(out.target_addr, 0x1000u);
    CHECK_EQ(out.length, 4096u);
    CHECK_EQ(out.initiator_addr, 0x2000u);
    CHECK(!decode_samehost_request(b, sizeof b - 1, out, why));
    CHECK(!decode_samehost_request(nullptr, sizeof b, out, why));
    auto rejects = [&](SameHostRequest x, int poke = -1) {
        unsigned char c[kSameHostRequestLen];
        encode_samehost_request(x, c);
        if (poke >= 0) c[poke] = 1;
        std::string w;
        SameHostRequest o;
        return !decode_samehost_request(c, sizeof c, o, w) && !w.empty();
    };
    CHECK(rejects(SameHostRequest{2, 0x1000, 1, 0x2000}));
    CHECK(rejects(r, 3));                                         // reserved byte
    CHECK(rejects(SameHostRequest{0, 0x1000, 0, 0x2000}));       // empty
    CHECK(rejects(SameHostRequest{0, 0x1000, kSameHostMaxLength + 1, 0x2000}));
    CHECK(rejects(SameHostRequest{0, UINT64_MAX - 10, 16, 0x2000}));  // target wraps
    CHECK(rejects(SameHostRequest{1, 0x1000, 16, UINT64_MAX - 10}));  // initiator wraps
    uint32_t code = 0;
    unsigned char s[kSameHostStatusLen];
    encode_samehost_status(kSameHostCopyFailed, s);
    CHECK(decode_samehost_status(s, sizeof s, code) && code == kSameHostCopyFailed);
    s[7] ^= 1;
    CHECK(!decode_samehost_status(s, sizeof s, code));
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
