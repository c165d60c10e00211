// RDMA failure handling (docs/wire-protocol.md, RDMA slicing and failure
// handling): what a work completion status means for a slice, and per
// peer-NIC-path ("rail") error accounting with pauses.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace mcrs::rdma {

// Numeric values of libibverbs' enum ibv_wc_status (verbs.h), which every
// provider returns; we do not include verbs.h here.
enum WcStatus : int {
    kWcSuccess = 0,
    kWcLocLenErr = 1,
    kWcLocQpOpErr = 2,
    kWcLocEecOpErr = 3,
    kWcLocProtErr = 4,
    kWcWrFlushErr = 5,
    kWcMwBindErr = 6,
    kWcBadRespErr = 7,
    kWcLocAccessErr = 8,
    kWcRemInvReqErr = 9,
    kWcRemAccessErr = 10,
    kWcRemOpErr = 11,
    kWcRetryExcErr = 12,
    kWcRnrRetryExcErr = 13,
    kWcLocRddViolErr = 14,
    kWcRemInvRdReqErr = 15,
    kWcRemAbortErr = 16,
    kWcInvEecnErr = 17,
    kWcInvEecStateErr = 18,
    kWcFatalErr = 19,
    kWcRespTimeoutErr = 20,
    kWcGeneralErr = 21,
    kWcTmErr = 22,
    kWcTmRndvIncomplete = 23,
};

// "IBV_WC_..." for known values, "IBV_WC_<n>" otherwise.
std::string wc_status_name(int status);

enum class WcClass {
    Success,      // 0
    Flush,        // 5: the QP went to error for another reason; retry, blame nobody
    LocalFault,   // 1 2 3 4 6 8 14: our side (length, QP state, protection, MW, access,
                  //   RDD): hand the slice to another local NIC
    RemoteFault,  // everything else, unknown values included: tear the endpoint
                  //   down, blame the peer rail, retry on another peer NIC
};
WcClass classify_wc_status(int status);

struct CompletionDecision {
    enum class Action { Complete, Retry, Fail } action = Action::Complete;
    int next_retry_count = 0;
    bool change_local_nic = false;
    bool teardown_endpoint = false;
    bool blame_peer_rail = false;
};

// A slice with `retry_count` finished with `status`. Any failure increments
// the count; when it reaches `max_retry` (MC_RETRY_CNT, 9 attempts) the slice
// fails.
CompletionDecision decide_completion(int status, int retry_count, int max_retry);

struct RailPolicy {
    int error_threshold = 5;       // errors within `window_ms` that pause a rail
    int64_t window_ms = 5000;
    int64_t pause_ms = 30000;      // MC_RDMA_RAIL_PAUSE_SECONDS
};

// Thread-safe. Keys are peer NIC paths ("<server>@<device>"). Entries whose
// window and pause have passed are dropped, so memory follows the number of
// rails that failed recently.
class RailMonitor {
public:
    using Clock = std::function<int64_t()>;  // milliseconds, monotonic
    explicit RailMonitor(RailPolicy policy = {}, Clock clock = {});

    // Counts an error on `rail`. It pauses the rail when the count within the
    // sliding window (errors at most window_ms old) reaches the threshold, or at once when `has_alternative` (another
    // peer rail can carry the traffic). Errors on a paused rail neither count
    // nor extend the pause. Returns true when this call paused the rail.
    bool record_error(const std::string &rail, bool has_alternative);
    bool is_paused(const std::string &rail) const;
    // False when no rail can be paused right now: one relaxed load and a
    // clock read, no lock, so the data path can skip building rail keys.
    bool any_paused() const;
    // 0 when not paused.
    int64_t paused_for_ms(const std::string &rail) const;
    void clear(const std::string &rail);
    size_t tracked() const;
    const RailPolicy &policy() const { return policy_; }

private:
    struct State {
        std::vector<int64_t> errors;  // times of the errors inside the window
        int64_t paused_until = 0;
    };
    void expire_locked(int64_t now);

    RailPolicy policy_;
    Clock clock_;
    mutable std::mutex mu_;
    std::map<std::string, State> rails_;
    int64_t last_sweep_ = 0;
    // The latest paused_until ever set: past it no rail is paused. Only
    // grows (clear() leaves it; is_paused then takes the locked path).
    std::atomic<int64_t> paused_until_max_{0};
};

}  // namespace mcrs::rdma
