// The upstream-named entry points: construction, transports, diagnostics
// and bad arguments.
#include <cstdlib>
#include <cstring>

#include "engine_fixture.h"

using namespace mctest;

TEST(capi_create_with_upstream_signature) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(e != nullptr);
    char buf[64];
    CHECK_EQ(getLocalIpAndPort(e, buf, sizeof buf), 0);
    CHECK(std::strncmp(buf, "127.0.0.1:", 10) == 0);
    CHECK_EQ(std::string(buf), segment_name(e));
    // Truncating copy, like upstream's snprintf.
    char tiny[5];
    CHECK_EQ(getLocalIpAndPort(e, tiny, sizeof tiny), 0);
    CHECK_EQ(std::string(tiny), std::string("127."));
    CHECK(installTransport(e, "tcp", nullptr) != nullptr);  // already installed: same one
    CHECK(installTransport(e, "efa", nullptr) == nullptr);
    CHECK(std::string(mc_last_error_message()).find("not implemented") != std::string::npos);
    CHECK_EQ(mc_last_error_code(), ERR_NOT_IMPLEMENTED);
    {
        // RDMA without a loadable verbs library: a clear error, no exception.
        const char *old = std::getenv("MC_VERBS_LIBRARY");
        std::string saved = old ? old : "";
        setenv("MC_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1", 1);
        CHECK(installTransport(e, "rdma", nullptr) == nullptr);
        CHECK(std::string(mc_last_error_message()).find("/nonexistent/libibverbs.so.1") != std::string::npos);
        CHECK(mc_last_error_code() != 0);
        if (old) setenv("MC_VERBS_LIBRARY", saved.c_str(), 1);
        else unsetenv("MC_VERBS_LIBRARY");
    }
    CHECK_EQ(discoverTopology(e), 0);
    CHECK_EQ(showLinks(e, buf, sizeof buf, 1), 0);
    CHECK(std::string(buf).find("local_nics") != std::string::npos);
    nic_load_stat_t stats[1];
    size_t count = 1;
    CHECK_EQ(getNicLoadStats(e, stats, &count), 0);
    CHECK_EQ(count, 0u);  // no RDMA transport: no NICs
    CHECK_EQ(getNicLoadStats(e, nullptr, &count), -1);
    CHECK_EQ(warmupEfaSegment(e, "x"), ERR_NOT_IMPLEMENTED);
    CHECK(std::string(mc_last_error_message()).find("EFA") != std::string::npos);
    CHECK_EQ(closeSegment(e, 12345), ERR_INVALID_ARGUMENT);
    CHECK_EQ(removeLocalSegment(e, ""), ERR_INVALID_ARGUMENT);
    enableGracefulShutdown(e);
    destroyTransferEngine(e);
}

TEST(capi_no_transport_until_installed) {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
    REQUIRE(e != nullptr);
    transfer_engine_t peer = make_engine();
    REQUIRE(peer);
    std::vector<char> a(4096), b(4096);
    REQUIRE_EQ(registerLocalMemory(e, a.data(), a.size(), nullptr, 1), 0);
    REQUIRE_EQ(registerLocalMemory(peer, b.data(), b.size(), "cpu:0", 1), 0);
    segment_id_t seg = openSegment(e, segment_name(peer).c_str());
    REQUIRE(seg > 0);
    batch_id_t bid = allocateBatchID(e, 1);
    transfer_request r{OPCODE_READ, a.data(), seg, reinterpret_cast<uint64_t>(b.data()), 16};
    CHECK_EQ(submitTransfer(e, bid, &r, 1), MC_STATUS_NOT_SUPPORTED_TRANSPORT);
    CHECK(installTransport(e, "tcp", nullptr) != nullptr);
    CHECK_EQ(submitTransfer(e, bid, &r, 1), 0);
    CHECK_EQ(mc_batch_wait(e, bid, 10000), 0);
    CHECK_EQ(freeBatchID(e, bid), 0);
    destroyTransferEngine(e);
    destroyTransferEngine(peer);
}

TEST(capi_rejects_unknown_metadata_and_null_arguments) {
    CHECK(createTransferEngine("zk://127.0.0.1:1", "127.0.0.1", "", 0, 1) == nullptr);
    CHECK(std::string(mc_last_error_message()).find("'zk://'") != std::string::npos);
    CHECK(createTransferEngine(nullptr, "127.0.0.1", "", 0, 1) == nullptr);
    CHECK_EQ(registerLocalMemory(nullptr, nullptr, 0, nullptr, 1), ERR_INVALID_ARGUMENT);
    CHECK(std::string(mc_last_error_message()).find("engine handle is null") != std::string::npos);
    CHECK_EQ(openSegment(nullptr, "x"), -1);
    CHECK_EQ(allocateBatchID(nullptr, 1), INVALID_BATCH);
    CHECK_EQ(getTransferStatus(nullptr, 1, 0, nullptr), MC_STATUS_INVALID_ARGUMENT);
    int n = 5;
    CHECK(getNotifsFromEngine(nullptr, &n) == nullptr);
    CHECK_EQ(n, 0);
    CHECK_EQ(freeNotifsMsgBuf(nullptr, 0), 0);
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.struct_size = 8;
    CHECK(mc_engine_create(&c) == nullptr);
    CHECK(std::string(mc_last_error_message()).find("struct_size") != std::string::npos);
    mc_engine_config_default(&c);
    c.tcp_lanes_per_peer = 0;
    CHECK(mc_engine_create(&c) == nullptr);
    CHECK(std::string(mc_last_error_message()).find("tcp_lanes_per_peer") != std::string::npos);
    CHECK_EQ(std::string(mc_error_name(ERR_SOCKET)), std::string("ERR_SOCKET"));
    CHECK_EQ(std::string(mc_engine_version()), std::string(MC_ENGINE_VERSION));
}

TEST(capi_batch_register_and_unregister) {
    transfer_engine_t e = make_engine();
    REQUIRE(e);
    std::vector<char> m(3 * 4096);
    buffer_entry_t list[3] = {{m.data(), 4096}, {m.data() + 4096, 4096}, {m.data() + 8192, 4096}};
    CHECK_EQ(registerLocalMemoryBatch(e, list, 3, "cpu:0"), 0);
    CHECK_EQ(registerLocalMemoryBatch(e, list, 1, "cpu:0"), ERR_ADDRESS_OVERLAPPED);
    void *addrs[3] = {m.data(), m.data() + 1, m.data() + 8192};
    // Best effort: the bad address is reported, the others are unregistered.
    CHECK_EQ(unregisterLocalMemoryBatch(e, addrs, 3), ERR_ADDRESS_NOT_REGISTERED);
    CHECK_EQ(unregisterLocalMemory(e, m.data() + 4096), 0);
    CHECK_EQ(unregisterLocalMemory(e, m.data()), ERR_ADDRESS_NOT_REGISTERED);
    destroyTransferEngine(e);
}

TEST(capi_with_nvidia_peermem_parsing) {
    struct Case {
        const char *value;
        int32_t mode;
    } cases[] = {{nullptr, MC_GPU_REG_PEERMEM}, {"0", MC_GPU_REG_DMABUF},   {"off", MC_GPU_REG_DMABUF},
                 {" FALSE ", MC_GPU_REG_DMABUF}, {"1", MC_GPU_REG_PEERMEM}, {"enable", MC_GPU_REG_PEERMEM},
                 {"maybe", MC_GPU_REG_PEERMEM}};
    for (const auto &c : cases) {
        if (c.value) setenv("WITH_NVIDIA_PEERMEM", c.value, 1);
        else unsetenv("WITH_NVIDIA_PEERMEM");
        transfer_engine_t e = make_engine();
        REQUIRE(e);
        int32_t mode = -1;
        CHECK_EQ(mc_engine_gpu_registration_mode(e, &mode), 0);
        if (mode != c.mode)
            mctest::record_failure(__FILE__, __LINE__,
                                   std::string("WITH_NVIDIA_PEERMEM=") + (c.value ? c.value : "(unset)") +
                                       " gave mode " + std::to_string(mode));
        destroyTransferEngine(e);
    }
    unsetenv("WITH_NVIDIA_PEERMEM");
    // An explicit mode wins over the variable.
    setenv("WITH_NVIDIA_PEERMEM", "0", 1);
    mc_engine_config_t c;
    mc_engine_config_default(&c);
    c.local_server_name = "127.0.0.1";
    c.bind_address = "127.0.0.1";
    c.gpu_registration_mode = MC_GPU_REG_AUTO;
    transfer_engine_t e = mc_engine_create(&c);
    REQUIRE(e);
    int32_t mode = -1;
    mc_engine_gpu_registration_mode(e, &mode);
    CHECK_EQ(mode, MC_GPU_REG_AUTO);
    destroyTransferEngine(e);
    unsetenv("WITH_NVIDIA_PEERMEM");
}

// Upstream's createTransferEngine binds every interface; MC_BIND_ADDRESS
// (ours) restricts it without a code change. 127.0.0.2 is another address
// of this host: reachable with the wildcard, refused when bound to .1.
TEST(capi_bind_address_env_restricts_listeners) {
    auto reachable = [](const char *ip, uint16_t port) {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        inet_pton(AF_INET, ip, &a.sin_addr);
        bool ok = ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
        ::close(fd);
        return ok;
    };
    unsetenv("MC_BIND_ADDRESS");
    transfer_engine_t any = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    REQUIRE(any);
    CHECK(reachable("127.0.0.2", rpc_port(any)));
    CHECK(reachable("127.0.0.2", data_port(any)));
    destroyTransferEngine(any);

    setenv("MC_BIND_ADDRESS", "127.0.0.1", 1);
    transfer_engine_t one = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    unsetenv("MC_BIND_ADDRESS");
    REQUIRE(one);
    CHECK(reachable("127.0.0.1", rpc_port(one)));
    CHECK(!reachable("127.0.0.2", rpc_port(one)));
    CHECK(reachable("127.0.0.1", data_port(one)));
    CHECK(!reachable("127.0.0.2", data_port(one)));
    destroyTransferEngine(one);

    // A bad value is a clear error at creation, not a silent wildcard.
    setenv("MC_BIND_ADDRESS", "not-an-address", 1);
    transfer_engine_t bad = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    unsetenv("MC_BIND_ADDRESS");
    CHECK(bad == nullptr);
    if (bad) destroyTransferEngine(bad);
}
