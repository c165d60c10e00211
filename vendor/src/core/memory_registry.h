// The engine's registered local memory. Every transfer, local or served to a
// peer, pins the registration it touches; unregistering removes the entry at
// once (so no new transfer can start on it) and then waits for the pins to
// drop, so memory is never handed back to its owner while I/O may touch it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

namespace mcrs {

struct Region {
    uint64_t addr = 0;
    uint64_t length = 0;
    bool remote_accessible = true;
    std::string location;
    int device = -1;          // GPU ordinal for device memory, -1 for host
    std::string ipc_handle;   // CUDA IPC handle of its allocation (hex), if exported
    uint64_t ipc_offset = 0;  // of `addr` inside that allocation

    uint64_t end() const { return addr + length; }

    // Pin count: one per request in flight on this region. Atomic because
    // every request takes and drops one (a mutex here cost more than the
    // rest of a small request's bookkeeping); `mu`/`cv` only wake an
    // unregister waiting for the count to reach zero.
    std::atomic<uint64_t> pins{0};
    std::mutex mu;
    std::condition_variable cv;
};

// RAII pin on a Region; movable, not copyable.
class RegionPin {
public:
    RegionPin() = default;
    explicit RegionPin(std::shared_ptr<Region> r);
    ~RegionPin() { release(); }
    RegionPin(const RegionPin &) = delete;
    RegionPin &operator=(const RegionPin &) = delete;
    RegionPin(RegionPin &&o) noexcept : r_(std::move(o.r_)) {}
    RegionPin &operator=(RegionPin &&o) noexcept {
        if (this != &o) {
            release();
            r_ = std::move(o.r_);
        }
        return *this;
    }
    explicit operator bool() const { return r_ != nullptr; }
    // A second pin on the same region (for a request whose range lies
    // inside a region this pin already holds: no registry lookup).
    RegionPin share() const { return RegionPin(r_); }
    const Region *region() const { return r_.get(); }
    void release();

private:
    std::shared_ptr<Region> r_;
};

struct RegionInfo {
    uint64_t addr;
    uint64_t length;
    bool remote_accessible;
    std::string location;
    int device = -1;
    std::string ipc_handle;
    uint64_t ipc_offset = 0;
};

class MemoryRegistry {
public:
    // Throws Error: kErrInvalidArgument (null/zero/overflow/unmapped),
    // kErrAddressOverlapped.
    void add(uint64_t addr, uint64_t length, const std::string &location, bool remote_accessible);
    // Adds all or none; the list is checked against itself and the registry.
    void add_batch(const std::vector<RegionInfo> &regions);
    // Throws kErrAddressNotRegistered when `addr` is not the start of a region.
    // Blocks until in-flight I/O on the region has finished.
    void remove(uint64_t addr);

    // A pin on the region that wholly contains [addr, addr+len), or an empty
    // pin. `need_remote` restricts the search to remote-accessible regions.
    RegionPin pin(uint64_t addr, uint64_t len, bool need_remote) const;

    // Waits until no transfer pins the region that starts at `addr`
    // (timeout_ms < 0: forever). Throws kErrAddressNotRegistered; returns
    // false on timeout.
    bool wait_idle(uint64_t addr, int64_t timeout_ms) const;

    std::vector<RegionInfo> snapshot(bool remote_only) const;
    uint64_t generation() const;
    size_t size() const;
    // Removes everything (engine teardown); waits for pins like remove().
    void clear();

private:
    void check_new(uint64_t addr, uint64_t length) const;  // caller holds mu_
    static void wait_unpinned(const std::shared_ptr<Region> &r);

    mutable std::shared_mutex mu_;
    std::map<uint64_t, std::shared_ptr<Region>> by_addr_;
    uint64_t generation_ = 0;
};

// Location of the first page of a host buffer ("cpu:<numa node>"), or "*".
std::string detect_host_location(const void *addr);
// True when every page of [addr, addr+len) is mapped in this process.
bool range_is_mapped(uint64_t addr, uint64_t len);

}  // namespace mcrs
