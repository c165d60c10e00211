// One client must not be able to exhaust our ports: idle deadlines, caps per
// source address, an allow-list, and a byte budget for notifications. The
// attacker's sockets are bound to 127.0.0.2; the legitimate engine connects
// from 127.0.0.1, and each test ends by proving that it still works.
#include <dirent.h>
#include <poll.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>

#include "engine_fixture.h"

using namespace mctest;

namespace {

transfer_engine_t make_limited(const std::function<void(mc_engine_config_t &)> &tweak) {
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.local_server_name = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.tcp_progress_timeout_ms = 3000;
    c.handshake_timeout_ms = 3000;
    c.enable_same_host = 0;
    tweak(c);
    transfer_engine_t e = mc_engine_create(&c);
    if (!e) std::fprintf(stderr, "mc_engine_create: %s\n", mc_last_error_message());
    return e;
}

// A TCP connection from `src` (any 127.0.0.0/8 address) to 127.0.0.1:port.
int connect_from(const char *src, uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, src, &a.sin_addr);
    sockaddr_in b{};
    b.sin_family = AF_INET;
    b.sin_port = htons(port);
    b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr *>(&b), sizeof b) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// True when the server closed `fd` (EOF or reset) within `ms`.
bool closed_within(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return false;
    char b;
    ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

size_t thread_count() {
    size_t n = 0;
    DIR *d = ::opendir("/proc/self/task");
    if (!d) return 0;
    while (dirent *e = ::readdir(d))
        if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    return n;
}

mc_engine_limit_counters_t limits(transfer_engine_t e) {
    mc_engine_limit_counters_t c{};
    mc_engine_get_limit_counters(e, &c);
    return c;
}

struct Fds {
    std::vector<int> v;
    ~Fds() {
        for (int f : v)
            if (f >= 0) ::close(f);
    }
};

// A legitimate engine on 127.0.0.1 opens the target and moves bytes both ways.
void legit_peer_transfers(transfer_engine_t target, std::vector<char> &tmem) {
    transfer_engine_t init = make_limited([](mc_engine_config_t &) {});
    REQUIRE(init);
    std::vector<char> imem(tmem.size());
    REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "cpu:0", 1), 0);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    CHECK(seg > 0);
    if (seg > 0) {
        fill_random(tmem, 3);
        uint64_t t = reinterpret_cast<uint64_t>(tmem.data());
        auto st = run_batch(init, {{OPCODE_READ, imem.data(), seg, t, tmem.size()}}, 10000);
        CHECK(st.size() == 1 && st[0] == STATUS_COMPLETED);
        CHECK(std::memcmp(imem.data(), tmem.data(), tmem.size()) == 0);
        fill_random(imem, 4);
        st = run_batch(init, {{OPCODE_WRITE, imem.data(), seg, t, imem.size()}}, 10000);
        CHECK(st.size() == 1 && st[0] == STATUS_COMPLETED);
        CHECK(std::memcmp(imem.data(), tmem.data(), tmem.size()) == 0);
    }
    destroyTransferEngine(init);
}

}  // namespace

// 63 silent connections used to hold 63 of 64 slots (and a thread each)
// forever; now each is closed after the idle timeout and a legitimate peer
// (which needs 4 lanes) gets in.
TEST(ports_data_idle_connections_are_closed) {
    transfer_engine_t target = make_limited([](mc_engine_config_t &c) {
        c.tcp_max_server_connections = 64;
        c.tcp_max_connections_per_source = 64;
        c.tcp_idle_timeout_ms = 300;
    });
    REQUIRE(target);
    std::vector<char> tmem(1 << 16);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
    const uint16_t port = data_port(target);
    Fds idle;
    for (int i = 0; i < 63; ++i) idle.v.push_back(connect_from("127.0.0.2", port));
    // One sends half a header and stops: a stalled first header is idle too.
    REQUIRE(idle.v[0] >= 0);
    CHECK(::send(idle.v[0], "\x01\x02\x03", 3, MSG_NOSIGNAL) == 3);
    for (int f : idle.v) {
        REQUIRE(f >= 0);
        CHECK(closed_within(f, 5000));
    }
    CHECK(limits(target).tcp_connections_idle_closed >= 63u);
    legit_peer_transfers(target, tmem);
    destroyTransferEngine(target);
}

// One source address may hold only its share: connections beyond it are
// closed at accept while the ones it holds stay open, and a peer from
// another address is served meanwhile. Idle connections hold no thread.
TEST(ports_data_per_source_cap_and_no_thread_per_connection) {
    transfer_engine_t target = make_limited([](mc_engine_config_t &c) {
        c.tcp_max_server_connections = 64;
        c.tcp_max_connections_per_source = 40;
        c.tcp_idle_timeout_ms = 20000;
        c.tcp_server_workers = 4;
    });
    REQUIRE(target);
    std::vector<char> tmem(1 << 16);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
    const uint16_t port = data_port(target);
    const size_t threads_before = thread_count();
    Fds flood;
    for (int i = 0; i < 100; ++i) flood.v.push_back(connect_from("127.0.0.2", port));
    size_t refused = 0;
    for (size_t i = 0; i < flood.v.size(); ++i) {
        REQUIRE(flood.v[i] >= 0);
        if (i >= 40) refused += closed_within(flood.v[i], 3000) ? 1 : 0;
    }
    CHECK_EQ(refused, 60u);
    for (size_t i = 0; i < 40; ++i) CHECK(!closed_within(flood.v[i], 0));
    CHECK_EQ(limits(target).tcp_connections_refused, 60u);
    // 40 held connections, no thread for any of them.
    CHECK(thread_count() <= threads_before + 2);
    legit_peer_transfers(target, tmem);
    destroyTransferEngine(target);
}

// A pooled connection that the server closes between requests (its idle
// limit) is reconnected by our client instead of failing the next request.
TEST(ports_data_pooled_idle_close_then_reconnect) {
    transfer_engine_t target = make_limited([](mc_engine_config_t &c) {
        c.tcp_pooled_idle_timeout_ms = 200;
    });
    REQUIRE(target);
    std::vector<char> tmem(1 << 16);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
    transfer_engine_t init = make_limited([](mc_engine_config_t &) {});
    REQUIRE(init);
    std::vector<char> imem(tmem.size());
    REQUIRE_EQ(registerLocalMemory(init, imem.data(), imem.size(), "cpu:0", 1), 0);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    REQUIRE(seg > 0);
    uint64_t t = reinterpret_cast<uint64_t>(tmem.data());
    for (int round = 0; round < 3; ++round) {
        fill_random(tmem, static_cast<uint32_t>(round));
        auto st = run_batch(init, {{OPCODE_READ, imem.data(), seg, t, tmem.size()}}, 10000);
        CHECK(st.size() == 1 && st[0] == STATUS_COMPLETED);
        CHECK(std::memcmp(imem.data(), tmem.data(), tmem.size()) == 0);
        // Wait until the server has closed the pooled lane(s).
        uint64_t before = limits(target).tcp_connections_idle_closed;
        for (int i = 0; i < 300 && limits(target).tcp_connections_idle_closed == before; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        CHECK(limits(target).tcp_connections_idle_closed > before);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    destroyTransferEngine(init);
    destroyTransferEngine(target);
}

// A flood of connections from one address to the handshake port (opened
// and replaced continuously) must not shed a legitimate client, slow or not:
// the flood gets its share of the slots, so the total cap is never reached.
TEST(ports_handshake_per_source_cap_under_flood) {
    transfer_engine_t target = make_limited([](mc_engine_config_t &c) {
        c.handshake_max_connections = 64;
        c.handshake_max_connections_per_source = 8;
    });
    REQUIRE(target);
    std::vector<char> tmem(1 << 16);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
    const uint16_t port = rpc_port(target);
    std::atomic<bool> stop{false};
    std::atomic<int> opened{0};
    std::thread flood([&] {
        std::vector<int> ring(300, -1);
        size_t k = 0;
        while (!stop.load()) {
            if (ring[k] >= 0) ::close(ring[k]);
            ring[k] = connect_from("127.0.0.2", port);
            if (ring[k] >= 0) opened.fetch_add(1);
            k = (k + 1) % ring.size();
        }
        for (int f : ring)
            if (f >= 0) ::close(f);
    });
    while (opened.load() < 300) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    {
        // A slow legitimate client: connected before 200 more flood
        // connections arrive, it must not be the "oldest" that gets shed.
        RawConn slow(port);
        REQUIRE(slow.fd >= 0);
        const int mark = opened.load();
        while (opened.load() < mark + 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK(slow.send_bytes(le64(3) + std::string("\x01{}", 3)));
        std::string reply = slow.read_some();
        CHECK(reply.size() > 9);
    }
    transfer_engine_t init = make_limited([](mc_engine_config_t &) {});
    REQUIRE(init);
    for (int i = 0; i < 5; ++i) {
        segment_id_t seg = openSegment(init, segment_name(target).c_str());
        CHECK(seg > 0);
        if (seg > 0) CHECK_EQ(mc_segment_probe(init, seg), 0);
        closeSegment(init, seg);
    }
    stop.store(true);
    flood.join();
    CHECK(limits(target).handshake_connections_refused > 0u);
    destroyTransferEngine(init);
    legit_peer_transfers(target, tmem);
    destroyTransferEngine(target);
}

// Notifications are bounded in bytes, and one of them in size: refused ones
// fail at the sender; after draining, new ones are accepted.
TEST(ports_notify_byte_budget) {
    transfer_engine_t target = make_limited([](mc_engine_config_t &c) {
        c.notify_max_bytes = 1 << 20;
        c.notify_max_message_bytes = 64 << 10;
    });
    transfer_engine_t init = make_limited([](mc_engine_config_t &) {});
    REQUIRE(target && init);
    segment_id_t seg = openSegment(init, segment_name(target).c_str());
    REQUIRE(seg > 0);
    std::string big(100 << 10, 'x');
    notify_msg_t too_big{const_cast<char *>("n"), &big[0]};
    CHECK(genNotifyInEngine(init, static_cast<uint64_t>(seg), too_big) != 0);
    std::string body(60 << 10, 'y');
    notify_msg_t m{const_cast<char *>("n"), &body[0]};
    int ok = 0, refused = 0;
    for (int i = 0; i < 300; ++i) {
        if (genNotifyInEngine(init, static_cast<uint64_t>(seg), m) == 0) ++ok;
        else ++refused;
    }
    const uint64_t per = body.size() + 1;
    CHECK_EQ(static_cast<uint64_t>(ok), (1u << 20) / per);
    CHECK_EQ(ok + refused, 300);
    auto lc = limits(target);
    CHECK(lc.notification_bytes_queued <= (1u << 20));
    CHECK_EQ(lc.notification_bytes_queued, ok * per);
    CHECK_EQ(lc.notifications_refused, static_cast<uint64_t>(refused) + 1);
    int count = 0;
    notify_msg_t *msgs = getNotifsFromEngine(target, &count);
    CHECK_EQ(count, ok);
    if (msgs) freeNotifsMsgBuf(msgs, count);
    CHECK_EQ(limits(target).notification_bytes_queued, 0u);
    CHECK_EQ(genNotifyInEngine(init, static_cast<uint64_t>(seg), m), 0);
    msgs = getNotifsFromEngine(target, &count);
    CHECK_EQ(count, 1);
    if (msgs) freeNotifsMsgBuf(msgs, count);
    destroyTransferEngine(init);
    destroyTransferEngine(target);
}

// Only allowed networks may connect, to either port.
TEST(ports_allow_list) {
    transfer_engine_t bad = make_limited([](mc_engine_config_t &c) {
        c.allowed_peer_networks = "127.0.0.0/8,127.0.0.1/33";
    });
    CHECK(bad == nullptr);
    CHECK(std::string(mc_last_error_message()).find("127.0.0.1/33") != std::string::npos);
    if (bad) destroyTransferEngine(bad);

    transfer_engine_t target = make_limited([](mc_engine_config_t &c) {
        c.allowed_peer_networks = "127.0.0.1/32, ::1/128";
    });
    REQUIRE(target);
    std::vector<char> tmem(1 << 16);
    REQUIRE_EQ(registerLocalMemory(target, tmem.data(), tmem.size(), "cpu:0", 1), 0);
    for (uint16_t port : {data_port(target), rpc_port(target)}) {
        int outsider = connect_from("127.0.0.2", port);
        REQUIRE(outsider >= 0);
        CHECK(closed_within(outsider, 3000));
        ::close(outsider);
        int insider = connect_from("127.0.0.1", port);
        REQUIRE(insider >= 0);
        CHECK(!closed_within(insider, 100));
        ::close(insider);
    }
    auto lc = limits(target);
    CHECK_EQ(lc.tcp_connections_refused, 1u);
    CHECK_EQ(lc.handshake_connections_refused, 1u);
    legit_peer_transfers(target, tmem);
    destroyTransferEngine(target);
}

// A caller built against the header before the limit fields passes the
// older struct_size; the library must not read past it (the fields keep
// their defaults), and other sizes are still refused.
TEST(ports_config_older_struct_size_keeps_defaults) {
    const size_t v1 = (offsetof(mc_engine_config_t, tcp_max_server_connections) + 7) & ~size_t(7);
    transfer_engine_t e = make_limited([&](mc_engine_config_t &c) {
        c.struct_size = static_cast<uint32_t>(v1);
        c.tcp_idle_timeout_ms = 0;  // would be refused if it were read
        c.allowed_peer_networks = "not a network";
    });
    CHECK(e != nullptr);
    if (e) destroyTransferEngine(e);
    e = make_limited([&](mc_engine_config_t &c) { c.struct_size = static_cast<uint32_t>(v1 + 8); });
    CHECK(e == nullptr);
    CHECK(std::string(mc_last_error_message()).find("struct_size") != std::string::npos);
}
