// The same-host transport (transport/samehost) between processes: two
// processes move bytes by cross-memory attach with no TCP payload; the
// kernel-attested accept refuses this process itself and other uids; target
// ranges outside remote-accessible host buffers are rejected with canaries
// intact, and a rejected range fails only its request (the rest of its run
// is sent again); a bad initiator address fails only its task (alone or inside a
// vectored batch). The second process is this binary re-executed
// (--same-host-peer); protocol and decoder tests are in
// test_same_host_wire.cpp, shared helpers in same_host_fixture.h.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>

#include "same_host_fixture.h"

using namespace mctest;
using namespace shtest;

// The peer process (see Child).
int same_host_peer_main(int argc, char **argv) {
    if (argc < 4) return 2;
    size_t size = std::strtoull(argv[2], nullptr, 10);
    uint32_t seed = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
    transfer_engine_t e = make_engine(same_host());
    if (!e) return 1;
    Guarded mem(size), secret(8192);
    std::vector<char> pattern(size);
    fill_random(pattern, seed);
    std::memcpy(mem.data(), pattern.data(), size);
    std::memset(secret.data(), 's', secret.size);
    if (registerLocalMemory(e, mem.data(), size, "cpu:0", 1) != 0) return 1;
    if (registerLocalMemory(e, secret.data(), secret.size, "cpu:0", 0) != 0) return 1;
    std::printf("READY %s %llu %llu\n", segment_name(e).c_str(), static_cast<unsigned long long>(mem.addr()),
                static_cast<unsigned long long>(secret.addr()));
    std::fflush(stdout);
    char line[256];
    while (std::fgets(line, sizeof line, stdin)) {
        unsigned long long off = 0, len = 0;
        if (std::sscanf(line, "hash %llu %llu", &off, &len) == 2 && off + len <= size) {
            std::printf("%llu\n", static_cast<unsigned long long>(fnv(mem.data() + off, len)));
        } else if (std::sscanf(line, "shrink %llu", &len) == 1 && len > 0 && len <= size) {
            // Publishes only the first `len` bytes from now on; peers that
            // cached the descriptor still think the whole buffer is there.
            bool ok = unregisterLocalMemory(e, mem.data()) == 0 &&
                      registerLocalMemory(e, mem.data(), len, "cpu:0", 1) == 0;
            std::printf(ok ? "OK\n" : "BAD\n");
        } else if (std::strncmp(line, "reset", 5) == 0) {
            std::memcpy(mem.data(), pattern.data(), size);
            std::printf("OK\n");
        } else if (std::strncmp(line, "canary", 6) == 0) {
            bool ok = mem.canaries_intact() && secret.canaries_intact();
            for (size_t i = 0; i < secret.size; ++i) ok = ok && secret.data()[i] == 's';
            std::printf(ok ? "OK\n" : "BAD\n");
        } else if (std::strncmp(line, "counters", 8) == 0) {
            mc_engine_counters_t c = counters(e);
            std::printf("%llu %llu %llu\n", static_cast<unsigned long long>(c.same_host_served),
                        static_cast<unsigned long long>(c.tcp_requests_served),
                        static_cast<unsigned long long>(c.tcp_requests_rejected));
        } else if (std::strncmp(line, "socket", 6) == 0) {
            std::printf("%s\n", json_string_or(descriptor_json(e), "mc_same_host", "").c_str());
        } else {
            break;
        }
        std::fflush(stdout);
    }
    destroyTransferEngine(e);
    return 0;
}

TEST(same_host_two_processes_move_every_byte_without_tcp_payload) {
    const size_t kMax = 16u << 20;
    const size_t kSize = kMax + 8192;
    Child child(kSize, 11);
    std::vector<char> pattern(kSize);
    fill_random(pattern, 11);
    transfer_engine_t e = make_engine(same_host());
    REQUIRE(e);
    std::vector<char> mine(kSize);
    REQUIRE_EQ(registerLocalMemory(e, mine.data(), mine.size(), "cpu:0", 0), 0);
    segment_id_t seg = openSegment(e, child.seg_name.c_str());
    REQUIRE(seg > 0);
    const size_t sizes[] = {1, 4096, (1u << 20) + 3, kMax};
    uint64_t n = 0;
    for (size_t sz : sizes) {
        REQUIRE_EQ(child.ask("reset"), std::string("OK"));
        std::memset(mine.data(), 0x5A, sz + 1);
        CHECK_EQ(one(e, OPCODE_READ, mine.data(), seg, child.buf + 5, sz), STATUS_COMPLETED);
        CHECK(std::memcmp(mine.data(), pattern.data() + 5, sz) == 0);
        CHECK_EQ(mine[sz], static_cast<char>(0x5A));
        std::vector<char> src(sz);
        fill_random(src, static_cast<uint32_t>(sz) + 1);
        std::memcpy(mine.data(), src.data(), sz);
        CHECK_EQ(one(e, OPCODE_WRITE, mine.data(), seg, child.buf + 100, sz), STATUS_COMPLETED);
        CHECK_EQ(child.hash(100, sz), fnv(src.data(), sz));
        CHECK_EQ(child.hash(100 + sz, 64), fnv(pattern.data() + 100 + sz, 64));  // nothing beyond
        n += 2;
    }
    // A batch of 256 scattered requests, READs and WRITEs mixed.
    REQUIRE_EQ(child.ask("reset"), std::string("OK"));
    fill_random(mine, 99);
    std::vector<transfer_request> reqs;
    for (size_t i = 0; i < 256; ++i)
        reqs.push_back(transfer_request{i % 2 ? OPCODE_WRITE : OPCODE_READ, mine.data() + i * 4096, seg,
                                        child.buf + (255 - i) * 4096, 4096});
    auto st = run_batch(e, reqs);
    REQUIRE_EQ(st.size(), 256u);
    for (size_t i = 0; i < 256; ++i) {
        CHECK_EQ(st[i], STATUS_COMPLETED);
        if (i % 2) CHECK_EQ(child.hash((255 - i) * 4096, 4096), fnv(mine.data() + i * 4096, 4096));
        else CHECK(std::memcmp(mine.data() + i * 4096, pattern.data() + (255 - i) * 4096, 4096) == 0);
    }
    n += 256;
    auto ci = counters(e);
    auto ct = child.counters();
    CHECK_EQ(ci.same_host_requests, n);
    CHECK_EQ(ci.tcp_requests_sent, 0u);
    CHECK_EQ(ct[0], n);
    CHECK_EQ(ct[1], 0u);
    CHECK_EQ(child.ask("canary"), std::string("OK"));
    destroyTransferEngine(e);
}

TEST(same_host_two_engines_of_one_process_are_refused_and_use_tcp) {
    // The target's accept sees its own pid and refuses; the initiator
    // falls back to TCP and the data is still right.
    transfer_engine_t t = make_engine(same_host()), i = make_engine(same_host());
    REQUIRE(t && i);
    std::vector<char> tm(1 << 20), im(1 << 20);
    fill_random(tm, 3);
    REQUIRE_EQ(registerLocalMemory(t, tm.data(), tm.size(), "cpu:0", 1), 0);
    REQUIRE_EQ(registerLocalMemory(i, im.data(), im.size(), "cpu:0", 0), 0);
    segment_id_t seg = openSegment(i, segment_name(t).c_str());
    REQUIRE(seg > 0);
    CHECK(!json_string_or(descriptor_json(t), "mc_same_host", "").empty());
    for (int round = 0; round < 2; ++round) {
        auto st = run_batch(i, {transfer_request{OPCODE_READ, im.data(), seg, reinterpret_cast<uint64_t>(tm.data()), 65536},
                                transfer_request{OPCODE_WRITE, im.data() + 65536, seg,
                                                 reinterpret_cast<uint64_t>(tm.data()) + 65536, 65536}});
        REQUIRE_EQ(st.size(), 2u);
        CHECK_EQ(st[0], STATUS_COMPLETED);
        CHECK_EQ(st[1], STATUS_COMPLETED);
        CHECK(std::memcmp(im.data(), tm.data(), 65536) == 0);
        CHECK(std::memcmp(im.data() + 65536, tm.data() + 65536, 65536) == 0);
    }
    auto ci = counters(i), ct = counters(t);
    CHECK_EQ(ci.same_host_requests, 0u);
    CHECK_EQ(ci.tcp_requests_sent, 4u);
    CHECK_EQ(ct.same_host_served, 0u);
    CHECK_EQ(ct.tcp_requests_served, 4u);
    // A raw connection from this process gets no greeting either.
    RawUnix raw(json_string_or(descriptor_json(t), "mc_same_host", ""));
    REQUIRE(raw.fd.valid());
    CHECK(raw.at_eof());
    destroyTransferEngine(i);
    destroyTransferEngine(t);
}

TEST(same_host_other_uid_is_refused_at_accept) {
    if (::geteuid() != 0) {
        mctest::record_skip("needs root to run a client under another uid (setuid 65534)");
        return;
    }
    transfer_engine_t t = make_engine(same_host());
    REQUIRE(t);
    Guarded mem(65536);
    std::memset(mem.data(), 't', mem.size);
    REQUIRE_EQ(registerLocalMemory(t, mem.data(), mem.size, "cpu:0", 1), 0);
    std::string name = json_string_or(descriptor_json(t), "mc_same_host", "");
    REQUIRE(mcrs::valid_samehost_socket_name(name));
    // Everything the child needs is made before fork: after it, only
    // syscalls (this process has threads).
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    std::vector<char> local(4096, 'c');
    unsigned char req[mcrs::kSameHostRequestLen];
    mcrs::encode_samehost_request(
        mcrs::SameHostRequest{mcrs::kSameHostOpWrite, mem.addr(), 4096, reinterpret_cast<uint64_t>(local.data())}, req);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, reinterpret_cast<sockaddr *>(&a), alen) != 0) _exit(4);
        timeval tv{5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        send(fd, req, sizeof req, MSG_NOSIGNAL);
        char got[64];
        ssize_t n = recv(fd, got, sizeof got, 0);
        // 0: closed without a word (a reset: it closed with our request unread).
        _exit(n == 0 || (n < 0 && errno == ECONNRESET) ? 0 : n > 0 ? 1 : 2);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    for (size_t k = 0; k < mem.size; ++k) REQUIRE_EQ(mem.data()[k], 't');
    CHECK(mem.canaries_intact());
    CHECK_EQ(counters(t).same_host_served, 0u);
    destroyTransferEngine(t);
}

TEST(same_host_target_ranges_outside_remote_host_buffers_are_rejected) {
    Child child(1 << 20, 5);
    std::string name = child.socket_name();
    REQUIRE(mcrs::valid_samehost_socket_name(name));
    std::vector<char> mine(1 << 16, 'm');
    const uint64_t maddr = reinterpret_cast<uint64_t>(mine.data());
    struct {
        uint8_t op;
        uint64_t target;
        uint64_t len;
    } cases[] = {
        {mcrs::kSameHostOpRead, child.local_only, 64},                // local-only buffer
        {mcrs::kSameHostOpWrite, child.local_only, 64},               // local-only buffer
        {mcrs::kSameHostOpRead, child.buf - 64, 64},                  // the canary before the buffer
        {mcrs::kSameHostOpWrite, child.buf + child.size - 8, 16},     // crosses the end
        {mcrs::kSameHostOpRead, 0x10, 8},                             // nothing there
        {mcrs::kSameHostOpWrite, UINT64_MAX - 7, 16},                 // wraps
        {mcrs::kSameHostOpRead, child.buf, uint64_t(1) << 41},        // absurd length
    };
    for (const auto &c : cases) {
        RawUnix raw(name);
        REQUIRE(raw.fd.valid());
        REQUIRE(raw.greeted());
        CHECK(raw.request(c.op, c.target, c.len, maddr) == RawUnix::status(mcrs::kSameHostRejected));
        CHECK(raw.at_eof());
    }
    {
        // A malformed request (unknown opcode) is rejected the same way.
        RawUnix raw(name);
        REQUIRE(raw.greeted());
        CHECK(raw.request(7, child.buf, 64, maddr) == RawUnix::status(mcrs::kSameHostRejected));
        CHECK(raw.at_eof());
    }
    for (char ch : mine) REQUIRE_EQ(ch, 'm');
    CHECK_EQ(child.ask("canary"), std::string("OK"));
    auto ct = child.counters();
    CHECK_EQ(ct[0], 0u);
    CHECK(ct[2] >= 8u);
    {
        // The target keeps serving: a good request on a fresh connection.
        RawUnix raw(name);
        REQUIRE(raw.greeted());
        CHECK(raw.request(mcrs::kSameHostOpRead, child.buf, 4096, maddr) == RawUnix::status(mcrs::kSameHostOk));
        std::vector<char> pattern(child.size);
        fill_random(pattern, 5);
        CHECK(std::memcmp(mine.data(), pattern.data(), 4096) == 0);
    }
}

TEST(same_host_bad_initiator_address_fails_only_its_task) {
    Child child(1 << 20, 8);
    transfer_engine_t e = make_engine(same_host());
    REQUIRE(e);
    // Registered but inaccessible: the target's copy into it faults.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void *bad = mmap(nullptr, 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(bad != MAP_FAILED);
    std::vector<char> good(4096, 'g');
    REQUIRE_EQ(registerLocalMemory(e, bad, 2 * page, "cpu:0", 0), 0);
    REQUIRE_EQ(registerLocalMemory(e, good.data(), good.size(), "cpu:0", 0), 0);
    segment_id_t seg = openSegment(e, child.seg_name.c_str());
    REQUIRE(seg > 0);
    std::string why;
    CHECK_EQ(one(e, OPCODE_READ, bad, seg, child.buf, 64, &why), STATUS_FAILED);
    CHECK(contains(why, "could not copy"));
    CHECK_EQ(one(e, OPCODE_WRITE, bad, seg, child.buf, 64, &why), STATUS_FAILED);
    CHECK(contains(why, "could not copy"));
    // The engine, and the same connections, keep serving.
    for (int k = 0; k < 8; ++k) CHECK_EQ(one(e, OPCODE_READ, good.data(), seg, child.buf, 4096), STATUS_COMPLETED);
    std::vector<char> pattern(child.size);
    fill_random(pattern, 8);
    CHECK(std::memcmp(good.data(), pattern.data(), 4096) == 0);
    CHECK_EQ(child.hash(0, 64), fnv(pattern.data(), 64));  // the failed WRITE wrote nothing
    auto ci = counters(e);
    CHECK_EQ(ci.same_host_requests, 10u);
    CHECK_EQ(ci.tcp_requests_sent, 0u);
    CHECK_EQ(child.counters()[0], 8u);
    CHECK_EQ(child.ask("canary"), std::string("OK"));
    REQUIRE_EQ(unregisterLocalMemory(e, bad), 0);
    destroyTransferEngine(e);
    munmap(bad, 2 * page);
}

// The target copies a batch's requests many per system call. A bad
// initiator address in the middle of a run fails that request alone: the
// ones before and after it, in both directions, move every byte.
TEST(same_host_vectored_batch_fails_only_the_bad_request) {
    const size_t kReq = 200, kLen = 512;
    Child child(kReq * kLen, 21);
    transfer_engine_t e = make_engine(same_host());
    REQUIRE(e);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void *bad = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(bad != MAP_FAILED);
    std::vector<char> local(kReq * kLen, 'x');
    REQUIRE_EQ(registerLocalMemory(e, bad, page, "cpu:0", 0), 0);
    REQUIRE_EQ(registerLocalMemory(e, local.data(), local.size(), "cpu:0", 0), 0);
    segment_id_t seg = openSegment(e, child.seg_name.c_str());
    REQUIRE(seg > 0);
    // Requests 0..99 READ block i; 100..199 WRITE local block i back to the
    // peer's block i - 100 + 100 (its upper half). Two bad ones: 37 (READ)
    // and 151 (WRITE).
    std::vector<transfer_request> reqs(kReq);
    for (size_t i = 0; i < kReq; ++i) {
        bool write = i >= kReq / 2;
        void *src = local.data() + i * kLen;
        if (i == 37 || i == 151) src = bad;
        reqs[i] = transfer_request{write ? OPCODE_WRITE : OPCODE_READ, src, seg, child.buf + i * kLen, kLen};
    }
    // The WRITEs carry a pattern of their own.
    for (size_t i = kReq / 2; i < kReq; ++i) std::memset(local.data() + i * kLen, static_cast<int>('a' + i % 26), kLen);
    batch_id_t b = allocateBatchID(e, kReq);
    REQUIRE_EQ(submitTransfer(e, b, reqs.data(), kReq), 0);
    REQUIRE_EQ(mc_batch_wait(e, b, 20000), 0);
    std::vector<char> pattern(child.size);
    fill_random(pattern, 21);
    size_t failed = 0;
    for (size_t i = 0; i < kReq; ++i) {
        transfer_status st{};
        REQUIRE_EQ(getTransferStatus(e, b, i, &st), 0);
        if (i == 37 || i == 151) {
            CHECK_EQ(st.status, STATUS_FAILED);
            CHECK(contains(error_of(e, b, i), "could not copy"));
            ++failed;
            continue;
        }
        CHECK_EQ(st.status, STATUS_COMPLETED);
        if (i < kReq / 2) {
            CHECK(std::memcmp(local.data() + i * kLen, pattern.data() + i * kLen, kLen) == 0);
        } else {
            std::vector<char> want(kLen, static_cast<char>('a' + i % 26));
            CHECK_EQ(child.hash(i * kLen, kLen), fnv(want.data(), kLen));
        }
    }
    CHECK_EQ(failed, 2u);
    // The failed WRITE left the peer's bytes alone; the failed READ left ours.
    CHECK_EQ(child.hash(151 * kLen, kLen), fnv(pattern.data() + 151 * kLen, kLen));
    CHECK(local[37 * kLen] == 'x');
    CHECK_EQ(freeBatchID(e, b), 0);
    CHECK_EQ(child.counters()[0], kReq - 2);
    CHECK_EQ(counters(e).tcp_requests_sent, 0u);
    CHECK_EQ(child.ask("canary"), std::string("OK"));
    REQUIRE_EQ(unregisterLocalMemory(e, bad), 0);
    destroyTransferEngine(e);
    munmap(bad, page);
}

// A REJECTED ends the same-host connection, and the target copies nothing
// after it: only the rejected requests fail, the rest of their run goes out
// again on a new connection. (The ranges are rejected because the target
// shrank its buffer after this engine cached its descriptor.)
TEST(same_host_rejected_range_fails_only_its_request) {
    const size_t kReq = 200, kLen = 512;
    Child child(1 << 20, 23);
    transfer_engine_t e = make_engine(same_host());
    REQUIRE(e);
    std::vector<char> local(kReq * kLen, 'x');
    REQUIRE_EQ(registerLocalMemory(e, local.data(), local.size(), "cpu:0", 0), 0);
    segment_id_t seg = openSegment(e, child.seg_name.c_str());
    REQUIRE(seg > 0);
    REQUIRE_EQ(child.ask("shrink " + std::to_string(512 << 10)), std::string("OK"));
    const size_t bad[] = {37, 38, 151};
    std::vector<transfer_request> reqs(kReq);
    for (size_t i = 0; i < kReq; ++i) {
        uint64_t off = i * kLen;
        if (std::find(std::begin(bad), std::end(bad), i) != std::end(bad)) off = (768 << 10) + i * kLen;
        reqs[i] = transfer_request{OPCODE_READ, local.data() + i * kLen, seg, child.buf + off, kLen};
    }
    batch_id_t b = allocateBatchID(e, kReq);
    REQUIRE_EQ(submitTransfer(e, b, reqs.data(), kReq), 0);
    REQUIRE_EQ(mc_batch_wait(e, b, 20000), 0);
    std::vector<char> pattern(child.size);
    fill_random(pattern, 23);
    size_t failed = 0;
    for (size_t i = 0; i < kReq; ++i) {
        transfer_status st{};
        REQUIRE_EQ(getTransferStatus(e, b, i, &st), 0);
        if (std::find(std::begin(bad), std::end(bad), i) != std::end(bad)) {
            CHECK_EQ(st.status, STATUS_FAILED);
            CHECK(contains(error_of(e, b, i), "rejected it"));
            CHECK(local[i * kLen] == 'x');
            ++failed;
            continue;
        }
        CHECK_EQ(st.status, STATUS_COMPLETED);
        CHECK(std::memcmp(local.data() + i * kLen, pattern.data() + i * kLen, kLen) == 0);
    }
    CHECK_EQ(failed, 3u);
    auto ci = counters(e);
    CHECK_EQ(ci.tcp_requests_sent, 0u);  // every request, the resent ones too, took the same-host path
    auto ct = child.counters();
    CHECK_EQ(ct[0], kReq - 3);
    CHECK_EQ(child.ask("canary"), std::string("OK"));
    CHECK_EQ(freeBatchID(e, b), 0);
    destroyTransferEngine(e);
}
