// The same-host initiator. Per target socket name it keeps a few Unix
// connections ("lanes"), each with one thread that takes a run of queued
// items, writes all their requests (samehost_wire.h) with one send and
// completes the items as their statuses come back, in order. No payload
// crosses the socket: the target copies straight into or out of our
// registered memory, which stays pinned until the item's status arrives.
//
// Before the first request a lane checks the target's identity
// (peer_identity.h: the socket's owner runs under our euid) and waits for
// its greeting (it greets only initiators it accepted). Any failure to
// connect or attest is logged once, the target is remembered as refused
// and its items, queued and future, go to the fallback (TCP).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/segment_descriptor.h"
#include "transport/transport.h"

namespace mcrs {

struct SameHostClientOptions {
    uint32_t connect_timeout_ms = 5000;
    uint32_t progress_timeout_ms = 30000;
    uint32_t lanes_per_peer = 4;
    uint32_t pipeline_depth = 64;
    // A lane idle this long reconnects before its next run, so it never
    // sends into a connection the target is closing for idleness (the
    // target's idle timeout must be longer).
    uint32_t reconnect_after_idle_ms = 20000;
};

class SameHostClient {
public:
    // Where a refused target's items go (TCP), with its descriptor.
    using Fallback = std::function<void(const SegmentDesc &, std::vector<TransferItem> &)>;

    SameHostClient(SameHostClientOptions opt, Fallback fallback);
    ~SameHostClient();
    SameHostClient(const SameHostClient &) = delete;
    SameHostClient &operator=(const SameHostClient &) = delete;

    // Queues host-memory items for the target of `desc` (its socket:
    // desc->same_host_socket). Items of a target that refused us go to the
    // fallback (now, or later from a lane thread). Never blocks on the
    // target; allocates nothing once the target is known.
    void submit(const std::shared_ptr<const SegmentDesc> &desc, std::vector<TransferItem> &items);
    // Fails everything queued, waits for the statuses of requests in flight
    // (the target may be copying into our memory until it answers; bounded
    // by the progress timeout) and joins all threads.
    void stop();
    // Requests sent on the same-host path.
    uint64_t requests_sent() const { return sent_.load(std::memory_order_relaxed); }

    class Peer;

private:
    SameHostClientOptions opt_;
    Fallback fallback_;
    std::mutex mu_;
    bool stopped_ = false;
    std::vector<std::shared_ptr<Peer>> peers_;
    std::atomic<uint64_t> sent_{0};
};

}  // namespace mcrs
