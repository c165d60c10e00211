// Engines that find each other through a real metadata store (etcd, Redis):
// the keys and values upstream uses, transfers between engines opened by
// name, keys removed at shutdown, a store that goes away and comes back,
// and an engine restarted under the same name. The store clients
// themselves are tested in test_metadata_store.cpp.
#include <chrono>
#include <cstring>
#include <memory>

#include "engine_fixture.h"
#include "metadata_servers.h"

using namespace mctest;
using namespace mdtest;

namespace {

struct StoreEngineOptions {
    std::string conn;
    std::string name;
    std::string cluster_id;
    std::string redis_password;
    uint32_t timeout_ms = 1500;
};

transfer_engine_t make_store_engine(const StoreEngineOptions &o) {
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.metadata_conn_string = o.conn.c_str();
    c.local_server_name = o.name.c_str();
    c.advertise_host = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.handshake_timeout_ms = 3000;
    c.metadata_timeout_ms = o.timeout_ms;
    if (!o.cluster_id.empty()) c.metadata_cluster_id = o.cluster_id.c_str();
    if (!o.redis_password.empty()) c.redis_password = o.redis_password.c_str();
    transfer_engine_t e = mc_engine_create(&c);
    if (!e) std::fprintf(stderr, "mc_engine_create: %s\n", mc_last_error_message());
    return e;
}

// A target with one remote-accessible buffer of a known pattern.
struct Target {
    transfer_engine_t e = nullptr;
    std::vector<char> mem = std::vector<char>(1 << 16);
    explicit Target(const StoreEngineOptions &o, uint32_t seed = 7) {
        fill_random(mem, seed);
        e = make_store_engine(o);
        if (e && registerLocalMemory(e, mem.data(), mem.size(), "cpu:0", 1) != 0) {
            std::fprintf(stderr, "register: %s\n", mc_last_error_message());
            destroyTransferEngine(e);
            e = nullptr;
        }
    }
    ~Target() {
        if (e) destroyTransferEngine(e);
    }
    uint64_t addr(size_t off = 0) const { return reinterpret_cast<uint64_t>(mem.data()) + off; }
};

// READ 4 KiB from the target and WRITE 4 KiB back, both checked.
bool read_and_write(transfer_engine_t init, segment_id_t seg, Target &t) {
    std::vector<char> local(8192, 'w');
    if (registerLocalMemory(init, local.data(), local.size(), "cpu:0", 0) != 0) return false;
    auto st = run_batch(init, {transfer_request{OPCODE_READ, local.data(), seg, t.addr(0), 4096},
                               transfer_request{OPCODE_WRITE, local.data() + 4096, seg, t.addr(8192), 4096}});
    bool ok = st.size() == 2 && st[0] == STATUS_COMPLETED && st[1] == STATUS_COMPLETED &&
              std::memcmp(local.data(), t.mem.data(), 4096) == 0 &&
              std::memcmp(t.mem.data() + 8192, local.data() + 4096, 4096) == 0;
    unregisterLocalMemory(init, local.data());
    return ok;
}

bool json_has(const std::string &text, const char *needle) { return text.find(needle) != std::string::npos; }

}  // namespace

TEST(metadata_engine_etcd_upstream_keys_transfers_and_removal) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    const std::string conn = "etcd://" + etcd.endpoint();
    {
        Target t({conn, "prefill-0"});
        REQUIRE(t.e);
        transfer_engine_t init = make_store_engine({conn, "decode-0"});
        REQUIRE(init);
        // The keys and values upstream writes: rpc_meta and ram, JSON with
        // a trailing newline in etcd.
        std::string rpc, ram;
        REQUIRE(etcd_raw_get(etcd.port(), "mooncake/rpc_meta/prefill-0", rpc));
        CHECK_EQ(rpc, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":" + std::to_string(rpc_port(t.e)) + "}\n");
        REQUIRE(etcd_raw_get(etcd.port(), "mooncake/ram/prefill-0", ram));
        CHECK(!ram.empty() && ram.back() == '\n');
        CHECK(json_has(ram, "\"name\":\"prefill-0\""));
        CHECK(json_has(ram, ("\"addr\":" + std::to_string(t.addr())).c_str()));
        CHECK(json_has(ram, "\"tcp_data_host\":\"127.0.0.1\""));
        CHECK_EQ(segment_name(t.e), std::string("prefill-0"));
        // Opened by name through the store; bytes verified both ways.
        segment_id_t seg = openSegment(init, "prefill-0");
        REQUIRE(seg > 0);
        CHECK(read_and_write(init, seg, t));
        // A notify finds the target through its rpc_meta address.
        notify_msg_t n{const_cast<char *>("decode-0"), const_cast<char *>("kv-ready")};
        CHECK_EQ(genNotifyInEngine(init, static_cast<uint64_t>(seg), n), 0);
        int count = 0;
        notify_msg_t *got = nullptr;
        CHECK(wait_until(3000, [&] {
            got = getNotifsFromEngine(t.e, &count);
            if (count == 0 && got) freeNotifsMsgBuf(got, 0);
            return count > 0;
        }));
        if (count > 0) {
            CHECK_EQ(std::string(got[0].msg), std::string("kv-ready"));
            freeNotifsMsgBuf(got, count);
        }
        // An unknown name: a clear error naming the key.
        CHECK(openSegment(init, "nobody") < 0);
        CHECK(json_has(mc_last_error_message(), "mooncake/ram/nobody"));
        destroyTransferEngine(init);
        std::string gone;
        CHECK(!etcd_raw_get(etcd.port(), "mooncake/rpc_meta/decode-0", gone));
    }
    // The target's keys are gone after its destruction.
    std::string gone;
    CHECK(!etcd_raw_get(etcd.port(), "mooncake/rpc_meta/prefill-0", gone));
    CHECK(!etcd_raw_get(etcd.port(), "mooncake/ram/prefill-0", gone));
}

TEST(metadata_engine_etcd_cluster_id_and_names_with_slash) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    const std::string conn = "etcd://" + etcd.endpoint();
    Target t({conn, "node/a", "team1"});
    REQUIRE(t.e);
    std::string v;
    // Upstream's layout: rpc_meta keeps the name, a name with '/' stores its
    // descriptor without "ram/".
    CHECK(etcd_raw_get(etcd.port(), "mooncake/team1/rpc_meta/node/a", v));
    CHECK(etcd_raw_get(etcd.port(), "mooncake/team1/node/a", v));
    CHECK(!etcd_raw_get(etcd.port(), "mooncake/team1/ram/node/a", v));
    CHECK(!etcd_raw_get(etcd.port(), "mooncake/rpc_meta/node/a", v));
    transfer_engine_t other_cluster = make_store_engine({conn, "reader", "team2"});
    REQUIRE(other_cluster);
    CHECK(openSegment(other_cluster, "node/a") < 0);  // another cluster id: not visible
    destroyTransferEngine(other_cluster);
    transfer_engine_t init = make_store_engine({conn, "reader", "team1"});
    REQUIRE(init);
    segment_id_t seg = openSegment(init, "node/a");
    REQUIRE(seg > 0);
    CHECK(read_and_write(init, seg, t));
    destroyTransferEngine(init);
}

TEST(metadata_engine_etcd_down_is_bounded_and_recovers) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    const std::string conn = "etcd://" + etcd.endpoint();
    Target t({conn, "p0"});
    REQUIRE(t.e);
    transfer_engine_t init = make_store_engine({conn, "d0", "", "", 1000});
    REQUIRE(init);
    segment_id_t seg = openSegment(init, "p0");
    REQUIRE(seg > 0);
    etcd.kill_now();
    // Lookups fail within the timeout, with a metadata error...
    auto t0 = Clock::now();
    CHECK(openSegment(init, "p1") < 0);
    CHECK(ms_since(t0) < 3000);
    CHECK(json_has(mc_last_error_message(), "etcd"));
    // ...segments already open keep working...
    CHECK(read_and_write(init, seg, t));
    // ...registering remote-accessible memory fails as a whole (peers could
    // not learn of it), and local-only memory is unaffected.
    std::vector<char> more(4096);
    CHECK(registerLocalMemory(t.e, more.data(), more.size(), "cpu:0", 1) != 0);
    CHECK(json_has(mc_last_error_message(), "mooncake/ram/p0"));
    CHECK(registerLocalMemory(t.e, more.data(), more.size(), "cpu:0", 0) == 0);  // was rolled back
    CHECK_EQ(unregisterLocalMemory(t.e, more.data()), 0);
    // ...and once etcd is back, new lookups succeed at once.
    REQUIRE(etcd.start());
    Target t1({conn, "p1"}, 9);
    REQUIRE(t1.e);
    segment_id_t seg1 = openSegment(init, "p1");
    REQUIRE(seg1 > 0);
    CHECK(read_and_write(init, seg1, t1));
    destroyTransferEngine(init);
}

TEST(metadata_engine_restarted_peer_under_the_same_name_is_found_again) {
    std::string bin = server_binary("etcd");
    if (bin.empty()) return;
    EtcdServer etcd(bin);
    REQUIRE(etcd.start());
    const std::string conn = "etcd://" + etcd.endpoint();
    ::setenv("MC_METADATA_CACHE_TTL_MS", "200", 1);
    transfer_engine_t init = make_store_engine({conn, "d0"});
    ::unsetenv("MC_METADATA_CACHE_TTL_MS");
    REQUIRE(init);
    segment_id_t seg = -1;
    {
        Target t({conn, "p0"}, 1);
        REQUIRE(t.e);
        seg = openSegment(init, "p0");
        REQUIRE(seg > 0);
        CHECK(read_and_write(init, seg, t));
    }
    Target again({conn, "p0"}, 2);  // new ports, same name
    REQUIRE(again.e);
    sleep_ms(300);  // past the cache TTL
    segment_id_t seg2 = openSegment(init, "p0");
    CHECK_EQ(seg2, seg);  // the same id, now with the new descriptor
    CHECK(read_and_write(init, seg2, again));
    destroyTransferEngine(init);
}

TEST(metadata_engine_redis_password_db_and_transfers) {
    std::string bin = server_binary("redis-server");
    if (bin.empty()) return;
    RedisServer redis(bin, "s3cret");
    REQUIRE(redis.start());
    {
        // Wrong password: engine creation fails naming authentication.
        transfer_engine_t bad = make_store_engine({redis.url(), "x", "", "wrong"});
        CHECK(bad == nullptr);
        CHECK(json_has(mc_last_error_message(), "auth") || json_has(mc_last_error_message(), "AUTH"));
    }
    Target t({redis.url(), "p0", "", "s3cret"});
    REQUIRE(t.e);
    mcrs::RespReply r;
    REQUIRE(redis.raw({"GET", "mooncake/rpc_meta/p0"}, r));
    CHECK_EQ(r.str, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":" + std::to_string(rpc_port(t.e)) + "}\n");
    transfer_engine_t init = make_store_engine({redis.url(), "d0", "", "s3cret"});
    REQUIRE(init);
    segment_id_t seg = openSegment(init, "p0");
    REQUIRE(seg > 0);
    CHECK(read_and_write(init, seg, t));
    destroyTransferEngine(init);
    // Through upstream's C entry point, with upstream's environment
    // variables (and MC_TCP_BIND_ADDRESS so that nothing leaves the host).
    ::setenv("MC_REDIS_PASSWORD", "s3cret", 1);
    ::setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1", 1);
    ::setenv("MC_BIND_ADDRESS", "127.0.0.1", 1);
    transfer_engine_t up = createTransferEngine(redis.url().c_str(), "d1", "ignored", 0, 0);
    ::unsetenv("MC_REDIS_PASSWORD");
    ::unsetenv("MC_TCP_BIND_ADDRESS");
    ::unsetenv("MC_BIND_ADDRESS");
    REQUIRE(up);
    REQUIRE(installTransport(up, "tcp", nullptr) != nullptr);
    segment_id_t seg2 = openSegment(up, "p0");
    REQUIRE(seg2 > 0);
    CHECK(read_and_write(up, seg2, t));
    destroyTransferEngine(up);
    REQUIRE(redis.raw({"EXISTS", "mooncake/rpc_meta/d1"}, r));
    CHECK_EQ(r.integer, 0);
}

TEST(metadata_engine_bad_connection_strings_are_clear_errors) {
    struct {
        const char *conn;
        const char *says;
    } cases[] = {
        {"ftp://127.0.0.1:1", "ftp"},
        {"https://127.0.0.1:1/metadata", "TLS"},
        {"etcd://", "endpoint"},
    };
    for (const auto &c : cases) {
        transfer_engine_t e = make_store_engine({c.conn, "x"});
        CHECK(e == nullptr);
        if (e) destroyTransferEngine(e);
        else CHECK(json_has(mc_last_error_message(), c.says));
    }
    // Nothing listens: creation fails at once with a metadata error.
    uint16_t port = free_port();
    auto t0 = Clock::now();
    transfer_engine_t e = make_store_engine({"http://127.0.0.1:" + std::to_string(port) + "/metadata", "x"});
    CHECK(e == nullptr);
    CHECK(ms_since(t0) < 3000);
    CHECK_EQ(mc_last_error_code(), -200);
}
