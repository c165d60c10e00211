#include "transport/rdma/rail_monitor.h"

#include <chrono>

namespace mcrs::rdma {

std::string wc_status_name(int status) {
    static const char *kNames[] = {
        "SUCCESS",        "LOC_LEN_ERR",     "LOC_QP_OP_ERR",      "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",   "WR_FLUSH_ERR",    "MW_BIND_ERR",        "BAD_RESP_ERR",
        "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",     "REM_OP_ERR",
        "RETRY_EXC_ERR",  "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",  "INV_EECN_ERR",    "INV_EEC_STATE_ERR",  "FATAL_ERR",
        "RESP_TIMEOUT_ERR", "GENERAL_ERR",   "TM_ERR",             "TM_RNDV_INCOMPLETE",
    };
    if (status >= 0 && status < static_cast<int>(sizeof kNames / sizeof kNames[0]))
        return std::string("IBV_WC_") + kNames[status];
    return "IBV_WC_" + std::to_string(status);
}

WcClass classify_wc_status(int status) {
    switch (status) {
        case kWcSuccess: return WcClass::Success;
        case kWcWrFlushErr: return WcClass::Flush;
        case kWcLocLenErr:
        case kWcLocQpOpErr:
        case kWcLocEecOpErr:
        case kWcLocProtErr:
        case kWcMwBindErr:
        case kWcLocAccessErr:
        case kWcLocRddViolErr: return WcClass::LocalFault;
        default: return WcClass::RemoteFault;
    }
}

CompletionDecision decide_completion(int status, int retry_count, int max_retry) {
    CompletionDecision d;
    WcClass c = classify_wc_status(status);
    if (c == WcClass::Success) {
        d.next_retry_count = retry_count;
        return d;
    }
    d.next_retry_count = (retry_count < 0 ? 0 : retry_count) + 1;
    d.action = d.next_retry_count >= max_retry ? CompletionDecision::Action::Fail
                                               : CompletionDecision::Action::Retry;
    d.change_local_nic = c == WcClass::LocalFault;
    d.teardown_endpoint = c == WcClass::RemoteFault;
    d.blame_peer_rail = c == WcClass::RemoteFault;
    return d;
}

RailMonitor::RailMonitor(RailPolicy policy, Clock clock)
    : policy_(policy), clock_(std::move(clock)) {
    if (!clock_)
        clock_ = [] {
            return std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                .count();
        };
    if (policy_.error_threshold < 1) policy_.error_threshold = 1;
}

void RailMonitor::expire_locked(int64_t now) {
    if (now - last_sweep_ < policy_.window_ms && rails_.size() < 4096) return;
    last_sweep_ = now;
    for (auto it = rails_.begin(); it != rails_.end();) {
        const State &s = it->second;
        bool idle = now >= s.paused_until &&
                    (s.errors.empty() || now - s.errors.back() >= policy_.window_ms);
        it = idle ? rails_.erase(it) : std::next(it);
    }
}

bool RailMonitor::record_error(const std::string &rail, bool has_alternative) {
    int64_t now = clock_();
    std::lock_guard<std::mutex> g(mu_);
    expire_locked(now);
    State &s = rails_[rail];
    if (now < s.paused_until) return false;
    if (s.paused_until != 0) s = State{};  // a pause ended: start afresh
    size_t keep = 0;
    for (int64_t t : s.errors)
        if (now - t < policy_.window_ms) s.errors[keep++] = t;
    s.errors.resize(keep);
    s.errors.push_back(now);
    if (has_alternative || static_cast<int>(s.errors.size()) >= policy_.error_threshold) {
        s.paused_until = now + policy_.pause_ms;
        s.errors.clear();
        if (s.paused_until > paused_until_max_.load(std::memory_order_relaxed))
            paused_until_max_.store(s.paused_until, std::memory_order_relaxed);
        return true;
    }
    return false;
}

bool RailMonitor::any_paused() const {
    int64_t until = paused_until_max_.load(std::memory_order_relaxed);
    return until != 0 && clock_() < until;
}

bool RailMonitor::is_paused(const std::string &rail) const { return paused_for_ms(rail) > 0; }

int64_t RailMonitor::paused_for_ms(const std::string &rail) const {
    if (!any_paused()) return 0;
    int64_t now = clock_();
    std::lock_guard<std::mutex> g(mu_);
    auto it = rails_.find(rail);
    if (it == rails_.end() || now >= it->second.paused_until) return 0;
    return it->second.paused_until - now;
}

void RailMonitor::clear(const std::string &rail) {
    std::lock_guard<std::mutex> g(mu_);
    rails_.erase(rail);
}

size_t RailMonitor::tracked() const {
    std::lock_guard<std::mutex> g(mu_);
    return rails_.size();
}

}  // namespace mcrs::rdma
