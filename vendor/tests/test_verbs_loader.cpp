// The run-time verbs loader: path resolution, error texts, once-per-path
// loading, optional entry points, and versioned lookups in real libibverbs.
#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/error.h"
#include "softverbs_fixture.h"

using namespace svtest;

namespace {

struct EnvGuard {
    std::string name;
    bool had = false;
    std::string old;
    EnvGuard(const char *n, const char *value) : name(n) {
        const char *v = std::getenv(n);
        had = v != nullptr;
        if (had) old = v;
        if (value) setenv(n, value, 1);
        else unsetenv(n);
    }
    ~EnvGuard() {
        if (had) setenv(name.c_str(), old.c_str(), 1);
        else unsetenv(name.c_str());
    }
};

std::string load_error(const std::string &path, int *code = nullptr) {
    try {
        ibv::VerbsLibrary::load(path);
    } catch (const mcrs::Error &e) {
        if (code) *code = e.code();
        return e.what();
    }
    return "";
}

bool has(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(verbs_loader_resolves_path) {
    {
        EnvGuard g("MC_VERBS_LIBRARY", nullptr);
        CHECK_EQ(ibv::VerbsLibrary::resolve_path(""), std::string("libibverbs.so.1"));
        CHECK_EQ(ibv::VerbsLibrary::resolve_path("/x/y.so"), std::string("/x/y.so"));
    }
    {
        EnvGuard g("MC_VERBS_LIBRARY", " /opt/verbs/libibverbs.so.1 ");
        CHECK_EQ(ibv::VerbsLibrary::resolve_path(""), std::string("/opt/verbs/libibverbs.so.1"));
        CHECK_EQ(ibv::VerbsLibrary::resolve_path("/explicit.so"), std::string("/explicit.so"));
    }
    {
        EnvGuard g("MC_VERBS_LIBRARY", svtest::softverbs_path());
        const ibv::VerbsLibrary &lib = ibv::VerbsLibrary::load();
        CHECK_EQ(lib.path(), std::string(svtest::softverbs_path()));
    }
}

TEST(verbs_loader_missing_library_is_a_clear_error) {
    int code = 0;
    std::string msg = load_error("/nonexistent/dir/libibverbs.so.1", &code);
    CHECK_EQ(code, static_cast<int>(mcrs::kErrContext));
    CHECK(has(msg, "RDMA was requested"));
    CHECK(has(msg, "/nonexistent/dir/libibverbs.so.1"));
    CHECK(has(msg, "could not be loaded"));
    CHECK(has(msg, "No such file"));  // the dlerror text
    CHECK(has(msg, "apt-get install libibverbs1 ibverbs-providers"));
    CHECK(has(msg, "MC_VERBS_LIBRARY"));
    CHECK(has(msg, "tcp"));
    // Remembered: the second attempt gives the same answer.
    CHECK_EQ(load_error("/nonexistent/dir/libibverbs.so.1"), msg);
}

TEST(verbs_loader_missing_symbol_names_it) {
    int code = 0;
    std::string msg = load_error("libm.so.6", &code);
    CHECK_EQ(code, static_cast<int>(mcrs::kErrContext));
    CHECK(has(msg, "RDMA was requested"));
    CHECK(has(msg, "lacks the required symbol ibv_get_device_list"));
}

TEST(verbs_loader_loads_once_per_path_from_many_threads) {
    std::vector<const ibv::VerbsLibrary *> seen(8, nullptr);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < seen.size(); ++i)
        threads.emplace_back([&seen, i] { seen[i] = &ibv::VerbsLibrary::load(svtest::softverbs_path()); });
    for (auto &t : threads) t.join();
    for (const auto *p : seen) CHECK(p == seen[0]);
    CHECK(seen[0] == sv().lib);
    const ibv::VerbsApi &api = seen[0]->api();
    CHECK(api.get_device_list && api.query_port_export && api.reg_mr && api.create_qp &&
          api.get_async_event && api.get_cq_event);
    CHECK(seen[0]->has_reg_mr_iova2());
    CHECK(seen[0]->has_dmabuf_mr());
    CHECK(seen[0]->supports_relaxed_ordering());
    CHECK(api.fork_init != nullptr);
    CHECK(seen[0]->symbol("mc_softverbs_configure") != nullptr);
    CHECK(seen[0]->symbol("no_such_symbol") == nullptr);
}

TEST(verbs_loader_relaxed_ordering_through_iova2) {
    configure("sv0:roce");
    Dev d("sv0");
    std::vector<char> buf(4096);
    Mr m(d, buf.data(), buf.size(), kAllAccess | ibv::IBV_ACCESS_RELAXED_ORDERING);
    REQUIRE(m.mr != nullptr);
    CHECK(m.mr->addr == buf.data());
    // The old entry point refuses optional bits, as libibverbs < 1.8 does.
    errno = 0;
    ibv::mr *raw = d.api.reg_mr(d.pd, buf.data(), buf.size(), ibv::IBV_ACCESS_LOCAL_WRITE |
                                                                   ibv::IBV_ACCESS_RELAXED_ORDERING);
    CHECK(raw == nullptr);
    CHECK_EQ(errno, EINVAL);
}

TEST(verbs_loader_copes_with_an_old_library) {
    const ibv::VerbsLibrary &old = ibv::VerbsLibrary::load(MC_SOFTVERBS_LEGACY_PATH);
    CHECK(!old.has_reg_mr_iova2());
    CHECK(!old.has_dmabuf_mr());
    CHECK(!old.supports_relaxed_ordering());
    CHECK(old.api().fork_init == nullptr);
    // The legacy build is a second copy of the stand-in with its own devices.
    auto configure_old = reinterpret_cast<int (*)(const char *)>(old.symbol("mc_softverbs_configure"));
    REQUIRE(configure_old != nullptr);
    REQUIRE_EQ(configure_old("old0:ib"), 0);
    const ibv::VerbsApi &api = old.api();
    int n = 0;
    ibv::device **list = api.get_device_list(&n);
    REQUIRE(list != nullptr);
    REQUIRE_EQ(n, 1);
    ibv::context *ctx = api.open_device(list[0]);
    api.free_device_list(list);
    REQUIRE(ctx != nullptr);
    ibv::pd *pd = api.alloc_pd(ctx);
    std::vector<char> buf(8192);
    // RELAXED_ORDERING is dropped rather than failing the registration.
    ibv::mr *m = old.reg_mr(pd, buf.data(), buf.size(), kAllAccess | ibv::IBV_ACCESS_RELAXED_ORDERING);
    CHECK(m != nullptr);
    errno = 0;
    CHECK(old.reg_dmabuf_mr(pd, 0, buf.size(), addr(buf.data()), 0, kAllAccess) == nullptr);
    CHECK_EQ(errno, EOPNOTSUPP);
    if (m) CHECK_EQ(api.dereg_mr(m), 0);
    CHECK_EQ(api.dealloc_pd(pd), 0);
    CHECK_EQ(api.close_device(ctx), 0);
}

// On a host with rdma-core installed, the loader must pick the IBVERBS_1.1
// entry points (the 1.0 ones take the pre-2006 struct layouts).
TEST(verbs_loader_real_libibverbs_uses_versioned_symbols) {
    void *probe = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!probe) {
        mctest::record_skip("libibverbs.so.1 not installed");
        return;
    }
    const ibv::VerbsLibrary &lib = ibv::VerbsLibrary::load("libibverbs.so.1");
    const ibv::VerbsApi &api = lib.api();
    void *v11 = dlvsym(probe, "ibv_query_port", "IBVERBS_1.1");
    void *v10 = dlvsym(probe, "ibv_query_port", "IBVERBS_1.0");
    CHECK(v11 != nullptr);
    CHECK(reinterpret_cast<void *>(api.query_port_export) == v11);
    if (v10) CHECK(v10 != v11);
    CHECK(reinterpret_cast<void *>(api.create_qp) == dlvsym(probe, "ibv_create_qp", "IBVERBS_1.1"));
    CHECK(reinterpret_cast<void *>(api.reg_mr) == dlvsym(probe, "ibv_reg_mr", "IBVERBS_1.1"));
    // Present only in one version: found by the plain lookup.
    CHECK(api.create_comp_channel != nullptr);
    if (dlsym(probe, "ibv_reg_mr_iova2")) CHECK(lib.has_reg_mr_iova2());
    dlclose(probe);
}

TEST(verbs_loader_names) {
    CHECK_EQ(std::string(ibv::wc_status_name(ibv::IBV_WC_REM_ACCESS_ERR)), std::string("IBV_WC_REM_ACCESS_ERR"));
    CHECK_EQ(std::string(ibv::wc_status_name(ibv::IBV_WC_GENERAL_ERR)), std::string("IBV_WC_GENERAL_ERR"));
    CHECK_EQ(std::string(ibv::wc_status_name(99)), std::string("IBV_WC_(unknown)"));
    CHECK_EQ(std::string(ibv::qp_state_name(ibv::IBV_QPS_RTS)), std::string("RTS"));
    CHECK_EQ(std::string(ibv::event_type_name(ibv::IBV_EVENT_PORT_ERR)), std::string("IBV_EVENT_PORT_ERR"));
    CHECK_EQ(std::string(ibv::event_type_name(ibv::IBV_EVENT_WQ_FATAL)), std::string("IBV_EVENT_WQ_FATAL"));
}
