// The typed configuration and its one reader of the environment
// (core/config.cpp), driven through an injected lookup.
#include <map>

#include "common/text.h"
#include "core/config.h"
#include "test_util.h"

using mcrs::EngineConfig;
using mcrs::EnvLookup;
using Names = std::vector<std::string>;

namespace {

EnvLookup env_of(std::map<std::string, std::string> m) {
    return [m](const char *name) -> std::optional<std::string> {
        auto it = m.find(name);
        if (it == m.end()) return std::nullopt;
        return it->second;
    };
}

}  // namespace

TEST(config_split_list_is_the_one_list_parser) {
    using mcrs::split_list;
    CHECK(split_list("") == Names{});
    CHECK(split_list(" , ,") == Names{});
    CHECK(split_list("mlx5_0") == Names{"mlx5_0"});
    CHECK((split_list(" mlx5_0 ,mlx5_1,\tmlx5_0, ") == Names{"mlx5_0", "mlx5_1"}));
    CHECK((split_list("10.0.0.0/8;fd00::/8 , 10.0.0.0/8") == Names{"10.0.0.0/8", "fd00::/8"}));
    CHECK_EQ(mcrs::join_list(split_list("a, b,,c")), std::string("a,b,c"));
}

TEST(config_engine_defaults_without_environment) {
    EngineConfig c = EngineConfig::from_env(env_of({}));
    CHECK_EQ(c.port_min, uint16_t(15000));
    CHECK_EQ(c.port_max, uint16_t(17000));
    CHECK_EQ(c.tcp_lanes_per_peer, 4u);
    CHECK_EQ(c.tcp_proto_version, 2u);
    CHECK(c.metadata_cache);
    CHECK(c.enable_same_host);
    CHECK(c.bind_address.empty());
    CHECK(c.device_allow_list.empty());
    CHECK(c.allowed_peer_networks.empty());
    c.validate();
}

TEST(config_engine_reads_each_knob_and_alias) {
    EngineConfig c = EngineConfig::from_env(env_of({
        {"MC_MIN_PRC_PORT", "20000"},  // upstream's misspelling, an alias
        {"MC_MAX_RPC_PORT", "21000"},
        {"MC_TCP_MAX_CONNECTIONS_PER_PEER", "7"},
        {"MC_TCP_PROTO", "1"},
        {"MC_DISABLE_METACACHE", ""},
        {"MC_DISABLE_SAME_HOST_PATH", "1"},
        {"MC_BIND_ADDRESS", " 127.0.0.1 "},
        {"MC_ALLOWED_PEER_NETWORKS", "127.0.0.0/8, ::1/128"},
        {"MC_TE_FILTERS", "mlx5_0"},
        {"MC_HANDSHAKE_CONNECT_TIMEOUT", "3"},
        {"MC_NOTIFY_MAX_BYTES", "4096"},
    }));
    CHECK_EQ(c.port_min, uint16_t(20000));
    CHECK_EQ(c.port_max, uint16_t(21000));
    CHECK_EQ(c.tcp_lanes_per_peer, 7u);
    CHECK_EQ(c.tcp_proto_version, 1u);
    CHECK(!c.metadata_cache);
    CHECK(!c.enable_same_host);
    CHECK_EQ(c.bind_address, std::string("127.0.0.1"));
    CHECK((c.allowed_peer_networks == Names{"127.0.0.0/8", "::1/128"}));
    // MC_TE_FILTERS is the RDMA transport's, read once into RdmaConfig.
    CHECK(c.device_allow_list.empty());
    CHECK((mcrs::rdma::RdmaConfig::from_env(env_of({{"MC_TE_FILTERS", "mlx5_0"}})).te_filters ==
           Names{"mlx5_0"}));
    CHECK_EQ(c.handshake_connect_timeout_ms, 3000u);
    CHECK_EQ(c.notify_max_bytes, uint64_t(4096));
    c.validate();
}

TEST(config_bad_values_keep_defaults) {
    EngineConfig c = EngineConfig::from_env(env_of({
        {"MC_MIN_RPC_PORT", "40000"},  // inside the ephemeral range: the whole range is rejected
        {"MC_TCP_LANES_PER_PEER", "many"},
        {"MC_TCP_IDLE_TIMEOUT_MS", "0"},
        {"MC_HANDSHAKE_MAX_LENGTH", "99999999999999999999"},
    }));
    CHECK_EQ(c.port_min, uint16_t(15000));
    CHECK_EQ(c.port_max, uint16_t(17000));
    CHECK_EQ(c.tcp_lanes_per_peer, 4u);
    CHECK_EQ(c.tcp_idle_timeout_ms, 5000u);
    CHECK_EQ(c.handshake_max_length, uint64_t(1) << 20);
}

TEST(config_process_overrides) {
    auto none = mcrs::ProcessOverrides::from_env(env_of({}));
    CHECK(!none.force_tcp);
    CHECK(!none.force_hca);
    CHECK(none.bind_address.empty());
    // Upstream tests presence only: an empty value still forces.
    auto o = mcrs::ProcessOverrides::from_env(
        env_of({{"MC_FORCE_TCP", ""}, {"MC_FORCE_HCA", "0"}, {"MC_BIND_ADDRESS", "::1"}}));
    CHECK(o.force_tcp);
    CHECK(o.force_hca);
    CHECK_EQ(o.bind_address, std::string("::1"));
    CHECK_EQ(EngineConfig::from_env(env_of({{"MC_FORCE_TCP", "1"}})).protocols,
             uint32_t(mcrs::kProtoTcp));
}

TEST(config_process_wide_knobs) {
    using mcrs::LogLevel;
    CHECK(mcrs::log_level_from_env(env_of({})) == LogLevel::Warn);
    CHECK(mcrs::log_level_from_env(env_of({{"MC_LOG_LEVEL", " debug"}})) == LogLevel::Debug);
    CHECK(mcrs::log_level_from_env(env_of({{"MC_LOG_LEVEL", "WARNING"}})) == LogLevel::Warn);
    CHECK(mcrs::log_level_from_env(env_of({{"MC_LOG_LEVEL", "loud"}})) == LogLevel::Warn);
    CHECK_EQ(mcrs::gpu_stage_chunk_bytes_from_env(env_of({})), size_t(1) << 20);
    CHECK_EQ(mcrs::gpu_stage_chunk_bytes_from_env(env_of({{"MC_GPU_STAGE_CHUNK_KIB", "64"}})),
             size_t(64) << 10);
    CHECK_EQ(mcrs::gpu_stage_chunk_bytes_from_env(env_of({{"MC_GPU_STAGE_CHUNK_KIB", "8"}})),
             size_t(1) << 20);
    CHECK(!mcrs::gpu_stage_kernel_from_env(env_of({})));
    CHECK(mcrs::gpu_stage_kernel_from_env(env_of({{"MC_GPU_STAGE_KERNEL", "1"}})));
    CHECK(!mcrs::gpu_stage_kernel_from_env(env_of({{"MC_GPU_STAGE_KERNEL", "7"}})));  // out of range: default
    CHECK(mcrs::verbs_library_from_env(env_of({})).empty());
    CHECK_EQ(mcrs::verbs_library_from_env(env_of({{"MC_VERBS_LIBRARY", " /x/libibverbs.so "}})),
             std::string("/x/libibverbs.so"));
}
