#include <map>

#include "common/error.h"
#include "test_util.h"
#include "core/config.h"

using namespace mcrs::rdma;
using mcrs::EnvLookup;
using mcrs::Error;

namespace {

EnvLookup env_of(std::map<std::string, std::string> m) {
    return [m](const char *name) -> std::optional<std::string> {
        auto it = m.find(name);
        if (it == m.end()) return std::nullopt;
        return it->second;
    };
}

}  // namespace

TEST(rdma_env_defaults) {
    RdmaConfig c = RdmaConfig::from_env(env_of({}));
    CHECK_EQ(c.ib_port, 1);
    CHECK_EQ(c.gid_index.index, -1);
    CHECK_EQ(c.num_qp_per_ep, 2);
    CHECK_EQ(c.max_wr, 256);
    CHECK_EQ(c.max_sge, 4);
    CHECK_EQ(c.max_inline, 64);
    CHECK_EQ(c.mtu, 4096);
    CHECK_EQ(c.max_cqe_per_ctx, 4096);
    CHECK_EQ(c.max_ep_per_ctx, 65536);
    CHECK_EQ(c.slice_size, uint64_t(65536));
    CHECK_EQ(c.fragment_limit, uint64_t(16384));
    CHECK_EQ(c.retry_cnt, 9);
    CHECK_EQ(c.rail_pause_seconds, 30);
    CHECK(!c.path_roundrobin);
    CHECK_EQ(c.ib_tc, -1);
    CHECK_EQ(c.ib_sl, -1);
    CHECK_EQ(c.sl(), 0);
    CHECK(c.te_filters.empty());
    CHECK(c.custom_topo_json.empty());
    CHECK_EQ(c.workers_per_ctx, 2);
    CHECK_EQ(c.slice_timeout_s, 0);
    c.validate();
    CHECK_EQ(c.slice_size, uint64_t(65536));
}

TEST(rdma_env_values_and_bad_values) {
    struct Case {
        const char *var, *value;
        std::function<int64_t(const RdmaConfig &)> get;
        int64_t want;
    } cases[] = {
        {"MC_IB_PORT", "2", [](const RdmaConfig &c) { return c.ib_port; }, 2},
        {"MC_IB_PORT", "0", [](const RdmaConfig &c) { return c.ib_port; }, 1},
        {"MC_IB_PORT", "256", [](const RdmaConfig &c) { return c.ib_port; }, 1},
        {"MC_IB_PORT", "one", [](const RdmaConfig &c) { return c.ib_port; }, 1},
        {"MC_NUM_QP_PER_EP", "4", [](const RdmaConfig &c) { return c.num_qp_per_ep; }, 4},
        {"MC_NUM_QP_PER_EP", "0", [](const RdmaConfig &c) { return c.num_qp_per_ep; }, 2},
        {"MC_MAX_WR", " 512 ", [](const RdmaConfig &c) { return c.max_wr; }, 512},
        {"MC_MAX_WR", "-5", [](const RdmaConfig &c) { return c.max_wr; }, 256},
        {"MC_MAX_SGE", "8", [](const RdmaConfig &c) { return c.max_sge; }, 8},
        {"MC_MAX_INLINE", "0", [](const RdmaConfig &c) { return c.max_inline; }, 0},
        {"MC_MTU", "1024", [](const RdmaConfig &c) { return c.mtu; }, 1024},
        {"MC_MTU", "1500", [](const RdmaConfig &c) { return c.mtu; }, 4096},
        {"MC_MTU", "8192", [](const RdmaConfig &c) { return c.mtu; }, 4096},
        {"MC_MAX_CQE_PER_CTX", "65536", [](const RdmaConfig &c) { return c.max_cqe_per_ctx; }, 4096},
        {"MC_SLICE_SIZE", "1048576", [](const RdmaConfig &c) { return int64_t(c.slice_size); }, 1048576},
        {"MC_SLICE_SIZE", "0", [](const RdmaConfig &c) { return int64_t(c.slice_size); }, 65536},
        {"MC_SLICE_SIZE", "1e6", [](const RdmaConfig &c) { return int64_t(c.slice_size); }, 65536},
        {"MC_FRAGMENT_RATIO", "8", [](const RdmaConfig &c) { return int64_t(c.fragment_limit); }, 8192},
        {"MC_FRAGMENT_RATIO", "0", [](const RdmaConfig &c) { return int64_t(c.fragment_limit); }, 16384},
        {"MC_RETRY_CNT", "3", [](const RdmaConfig &c) { return c.retry_cnt; }, 3},
        {"MC_RETRY_CNT", "128", [](const RdmaConfig &c) { return c.retry_cnt; }, 9},
        {"MC_RDMA_RAIL_PAUSE_SECONDS", "5", [](const RdmaConfig &c) { return c.rail_pause_seconds; }, 5},
        {"MC_RDMA_RAIL_PAUSE_SECONDS", "3600", [](const RdmaConfig &c) { return c.rail_pause_seconds; }, 30},
        {"MC_PATH_ROUNDROBIN", "1", [](const RdmaConfig &c) { return int64_t(c.path_roundrobin); }, 1},
        {"MC_PATH_ROUNDROBIN", "TRUE", [](const RdmaConfig &c) { return int64_t(c.path_roundrobin); }, 1},
        {"MC_PATH_ROUNDROBIN", "0", [](const RdmaConfig &c) { return int64_t(c.path_roundrobin); }, 0},
        {"MC_PATH_ROUNDROBIN", "rr", [](const RdmaConfig &c) { return int64_t(c.path_roundrobin); }, 0},
        {"MC_IB_TC", "106", [](const RdmaConfig &c) { return c.ib_tc; }, 106},
        {"MC_IB_TC", "300", [](const RdmaConfig &c) { return c.ib_tc; }, -1},
        {"MC_IB_SL", "3", [](const RdmaConfig &c) { return c.ib_sl; }, 3},
        {"MC_IB_SL", "16", [](const RdmaConfig &c) { return c.ib_sl; }, -1},
        {"MC_WORKERS_PER_CTX", "8", [](const RdmaConfig &c) { return c.workers_per_ctx; }, 8},
        {"MC_WORKERS_PER_CTX", "9", [](const RdmaConfig &c) { return c.workers_per_ctx; }, 2},
        {"MC_SLICE_TIMEOUT", "10", [](const RdmaConfig &c) { return c.slice_timeout_s; }, 10},
        {"MC_SLICE_TIMEOUT", "0", [](const RdmaConfig &c) { return c.slice_timeout_s; }, 0},
        {"MC_SLICE_TIMEOUT", "65536", [](const RdmaConfig &c) { return c.slice_timeout_s; }, 0},
        {"MC_GID_INDEX", "3", [](const RdmaConfig &c) { return c.gid_index.index; }, 3},
        {"NCCL_IB_GID_INDEX", "1", [](const RdmaConfig &c) { return c.gid_index.index; }, 1},
        {"MC_AUTO_GID_MAX_RETRIES", "17", [](const RdmaConfig &c) { return c.auto_gid_max_retries; }, 2},
        {"MC_PKEY_INDEX", "1", [](const RdmaConfig &c) { return c.pkey_index; }, 1},
    };
    for (const auto &c : cases) {
        RdmaConfig cfg = RdmaConfig::from_env(env_of({{c.var, c.value}}));
        int64_t got = c.get(cfg);
        if (got != c.want)
            mctest::record_failure(__FILE__, __LINE__,
                                   std::string(c.var) + "=" + c.value + " gave " + std::to_string(got));
        cfg.validate();  // whatever the environment, the result is valid
    }
    RdmaConfig f = RdmaConfig::from_env(env_of({{"MC_TE_FILTERS", " mlx5_0, mlx5_1 ,"},
                                                {"MC_CUSTOM_TOPO_JSON", " /etc/topo.json "}}));
    CHECK((f.te_filters == std::vector<std::string>{"mlx5_0", "mlx5_1"}));
    CHECK_EQ(f.custom_topo_json, std::string("/etc/topo.json"));
    // The fragment ratio is bounded by the slice size it divides.
    RdmaConfig s = RdmaConfig::from_env(env_of({{"MC_SLICE_SIZE", "16"}, {"MC_FRAGMENT_RATIO", "32"}}));
    CHECK_EQ(s.fragment_limit, uint64_t(4));
}

TEST(rdma_env_bad_gid_index_is_an_error) {
    for (const char *v : {"abc", "256", "-7"}) {
        bool threw = false;
        try {
            RdmaConfig::from_env(env_of({{"MC_GID_INDEX", v}}));
        } catch (const Error &e) {
            threw = e.code() == mcrs::kErrInvalidArgument &&
                    std::string(e.what()).find("MC_GID_INDEX") != std::string::npos;
        }
        if (!threw) mctest::record_failure(__FILE__, __LINE__, std::string("MC_GID_INDEX=") + v + " accepted");
    }
}

TEST(rdma_env_validate_programmatic) {
    RdmaConfig c;
    c.validate();
    struct {
        std::function<void(RdmaConfig &)> set;
        const char *field;
    } bad[] = {
        {[](RdmaConfig &x) { x.ib_port = 0; }, "ib_port"},
        {[](RdmaConfig &x) { x.mtu = 1500; }, "mtu"},
        {[](RdmaConfig &x) { x.num_qp_per_ep = 256; }, "num_qp_per_ep"},
        {[](RdmaConfig &x) { x.slice_size = 0; }, "slice_size"},
        {[](RdmaConfig &x) { x.fragment_limit = x.slice_size + 1; }, "fragment_limit"},
        {[](RdmaConfig &x) { x.retry_cnt = 0; }, "retry_cnt"},
        {[](RdmaConfig &x) { x.ib_sl = 16; }, "ib_sl"},
        {[](RdmaConfig &x) { x.gid_index.index = 300; }, "gid_index"},
        {[](RdmaConfig &x) { x.workers_per_ctx = 0; }, "workers_per_ctx"},
    };
    for (const auto &b : bad) {
        RdmaConfig x;
        b.set(x);
        bool threw = false;
        try {
            x.validate();
        } catch (const Error &e) {
            threw = std::string(e.what()).find(b.field) != std::string::npos;
        }
        if (!threw) mctest::record_failure(__FILE__, __LINE__, std::string("validate accepted bad ") + b.field);
    }
}

TEST(rdma_env_reads_process_environment) {
    setenv("MC_NUM_QP_PER_EP", "3", 1);
    setenv("MC_GID_INDEX", "2", 1);
    RdmaConfig c = RdmaConfig::from_env();
    CHECK_EQ(c.num_qp_per_ep, 3);
    CHECK_EQ(c.gid_index.index, 2);
    CHECK_EQ(c.gid_index.variable, std::string("MC_GID_INDEX"));
    unsetenv("MC_NUM_QP_PER_EP");
    unsetenv("MC_GID_INDEX");
}
