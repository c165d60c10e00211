#include <atomic>
#include <thread>

#include "test_util.h"
#include "transport/rdma/rail_monitor.h"

using namespace mcrs::rdma;

TEST(rdma_wc_status_classes) {
    struct {
        int status;
        WcClass cls;
        const char *name;
    } cases[] = {
        {0, WcClass::Success, "IBV_WC_SUCCESS"},
        {1, WcClass::LocalFault, "IBV_WC_LOC_LEN_ERR"},
        {2, WcClass::LocalFault, "IBV_WC_LOC_QP_OP_ERR"},
        {3, WcClass::LocalFault, "IBV_WC_LOC_EEC_OP_ERR"},
        {4, WcClass::LocalFault, "IBV_WC_LOC_PROT_ERR"},
        {5, WcClass::Flush, "IBV_WC_WR_FLUSH_ERR"},
        {6, WcClass::LocalFault, "IBV_WC_MW_BIND_ERR"},
        {7, WcClass::RemoteFault, "IBV_WC_BAD_RESP_ERR"},
        {8, WcClass::LocalFault, "IBV_WC_LOC_ACCESS_ERR"},
        {9, WcClass::RemoteFault, "IBV_WC_REM_INV_REQ_ERR"},
        {10, WcClass::RemoteFault, "IBV_WC_REM_ACCESS_ERR"},
        {11, WcClass::RemoteFault, "IBV_WC_REM_OP_ERR"},
        {12, WcClass::RemoteFault, "IBV_WC_RETRY_EXC_ERR"},
        {13, WcClass::RemoteFault, "IBV_WC_RNR_RETRY_EXC_ERR"},
        {14, WcClass::LocalFault, "IBV_WC_LOC_RDD_VIOL_ERR"},
        {15, WcClass::RemoteFault, "IBV_WC_REM_INV_RD_REQ_ERR"},
        {16, WcClass::RemoteFault, "IBV_WC_REM_ABORT_ERR"},
        {19, WcClass::RemoteFault, "IBV_WC_FATAL_ERR"},
        {20, WcClass::RemoteFault, "IBV_WC_RESP_TIMEOUT_ERR"},
        {21, WcClass::RemoteFault, "IBV_WC_GENERAL_ERR"},
        {23, WcClass::RemoteFault, "IBV_WC_TM_RNDV_INCOMPLETE"},
        {24, WcClass::RemoteFault, "IBV_WC_24"},
        {-1, WcClass::RemoteFault, "IBV_WC_-1"},
    };
    for (const auto &c : cases) {
        if (classify_wc_status(c.status) != c.cls)
            mctest::record_failure(__FILE__, __LINE__, "class of wc status " + std::to_string(c.status));
        CHECK_EQ(wc_status_name(c.status), std::string(c.name));
    }
}

TEST(rdma_completion_decisions) {
    using A = CompletionDecision::Action;
    CompletionDecision ok = decide_completion(kWcSuccess, 3, 9);
    CHECK(ok.action == A::Complete);
    CHECK_EQ(ok.next_retry_count, 3);
    CompletionDecision fl = decide_completion(kWcWrFlushErr, 0, 9);
    CHECK(fl.action == A::Retry);
    CHECK_EQ(fl.next_retry_count, 1);
    CHECK(!fl.blame_peer_rail && !fl.teardown_endpoint && !fl.change_local_nic);
    CompletionDecision lo = decide_completion(kWcLocProtErr, 2, 9);
    CHECK(lo.action == A::Retry);
    CHECK(lo.change_local_nic && !lo.blame_peer_rail && !lo.teardown_endpoint);
    CompletionDecision re = decide_completion(kWcRetryExcErr, 2, 9);
    CHECK(re.action == A::Retry);
    CHECK(re.teardown_endpoint && re.blame_peer_rail && !re.change_local_nic);
    // 9 attempts in all: retry counts 0..8, the 9th failure fails the slice.
    int attempts = 0, rc = 0;
    for (;;) {
        ++attempts;
        CompletionDecision d = decide_completion(kWcRemAccessErr, rc, 9);
        rc = d.next_retry_count;
        if (d.action == A::Fail) break;
        REQUIRE(attempts < 100);
    }
    CHECK_EQ(attempts, 9);
    CHECK(decide_completion(kWcWrFlushErr, 8, 9).action == A::Fail);
    CHECK(decide_completion(kWcWrFlushErr, 0, 1).action == A::Fail);
}

namespace {
struct FakeClock {
    int64_t now = 1000000;
    RailMonitor::Clock fn() {
        return [this] { return now; };
    }
};
}  // namespace

TEST(rdma_rail_pause_after_five_errors) {
    FakeClock c;
    RailMonitor m(RailPolicy{}, c.fn());
    const std::string rail = "10.0.0.2:15000@mlx5_1";
    for (int i = 0; i < 4; ++i) {
        CHECK(!m.record_error(rail, false));
        c.now += 1000;
    }
    CHECK(!m.is_paused(rail));
    CHECK(m.record_error(rail, false));  // 5th error within 5 s
    CHECK(m.is_paused(rail));
    CHECK_EQ(m.paused_for_ms(rail), int64_t(30000));
    CHECK(!m.is_paused("10.0.0.2:15000@mlx5_0"));
    // Errors while paused neither count nor extend the pause.
    c.now += 10000;
    CHECK(!m.record_error(rail, true));
    CHECK_EQ(m.paused_for_ms(rail), int64_t(20000));
    c.now += 20000;
    CHECK(!m.is_paused(rail));
    // Afterwards the count starts from zero.
    for (int i = 0; i < 4; ++i) CHECK(!m.record_error(rail, false));
    CHECK(m.record_error(rail, false));
}

TEST(rdma_rail_sliding_window) {
    FakeClock c;
    RailMonitor m(RailPolicy{}, c.fn());
    const std::string rail = "p@m";
    // Errors at 0, 1.5 s, 3 s, 4.5 s, then 6 s: the one at 0 has left the window.
    for (int i = 0; i < 4; ++i) {
        CHECK(!m.record_error(rail, false));
        c.now += 1500;
    }
    CHECK(!m.record_error(rail, false));  // only 4 within the last 5 s
    c.now += 100;
    CHECK(m.record_error(rail, false));  // now 5 within 5 s (1.5 .. 6.1)
}

TEST(rdma_rail_pause_with_alternative_and_policy) {
    FakeClock c;
    RailMonitor m(RailPolicy{5, 5000, 7000}, c.fn());
    CHECK(m.record_error("a@x", true));  // one error is enough with an alternative
    CHECK_EQ(m.paused_for_ms("a@x"), int64_t(7000));
    c.now += 7000;
    CHECK(!m.is_paused("a@x"));
    m.record_error("b@x", true);
    m.clear("b@x");
    CHECK(!m.is_paused("b@x"));
    // Old idle entries are dropped.
    for (int i = 0; i < 100; ++i) m.record_error("r" + std::to_string(i) + "@x", false);
    CHECK(m.tracked() >= 100);
    c.now += 60000;
    m.record_error("fresh@x", false);
    CHECK_EQ(m.tracked(), size_t(1));
    // A nonsensical threshold is clamped to 1.
    RailMonitor z(RailPolicy{0, 5000, 1000}, c.fn());
    CHECK(z.record_error("q@x", false));
}

TEST(rdma_rail_threads) {
    RailMonitor m;  // real clock
    std::atomic<int> paused{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; i < 500; ++i)
                if (m.record_error("rail" + std::to_string((t + i) % 8) + "@x", false)) ++paused;
        });
    for (auto &t : ts) t.join();
    CHECK_EQ(paused.load(), 8);  // each of the 8 rails paused exactly once
    for (int i = 0; i < 8; ++i) CHECK(m.is_paused("rail" + std::to_string(i) + "@x"));
}

TEST(rdma_rail_any_paused_fast_path) {
    FakeClock c;
    RailMonitor m(RailPolicy{5, 5000, 3000}, c.fn());
    CHECK(!m.any_paused());
    CHECK(!m.record_error("a", false));  // counted, not paused
    CHECK(!m.any_paused());
    CHECK(m.record_error("a", true));
    CHECK(m.any_paused());
    c.now += 1000;
    CHECK(m.record_error("b", true));  // the later pause sets the horizon
    c.now += 2500;
    CHECK(!m.is_paused("a"));
    CHECK(m.is_paused("b"));
    CHECK(m.any_paused());
    c.now += 600;
    CHECK(!m.any_paused());
    CHECK(!m.is_paused("b"));
    // clear() keeps the horizon (conservative); lookups stay exact.
    CHECK(m.record_error("c", true));
    m.clear("c");
    CHECK(m.any_paused());
    CHECK(!m.is_paused("c"));
}
