#include "core/memory_registry.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <sstream>

#include "common/error.h"
#include "common/range.h"
#include "common/text.h"
#include "common/log.h"

namespace mcrs {

namespace {
std::string range_str(uint64_t a, uint64_t l) {
    return "[" + hex(a) + ", " + hex(a + l) + ")";
}
}  // namespace

RegionPin::RegionPin(std::shared_ptr<Region> r) : r_(std::move(r)) {
    // Relaxed: a new pin comes from the registry (under its lock) or from
    // an existing pin, so the count cannot be observed going 0 -> 1 by an
    // unregister that already saw it reach zero.
    if (r_) r_->pins.fetch_add(1, std::memory_order_relaxed);
}

void RegionPin::release() {
    if (!r_) return;
    if (r_->pins.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // The waiter checks the count holding `mu`: taking it here before
        // notifying means the wake-up cannot fall between its check and
        // its wait.
        std::lock_guard<std::mutex> g(r_->mu);
        r_->cv.notify_all();
    }
    r_.reset();
}

bool range_is_mapped(uint64_t addr, uint64_t len) {
    long page = ::sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    uint64_t p = static_cast<uint64_t>(page);
    uint64_t start = addr & ~(p - 1);
    uint64_t end = addr + len;
    // mincore fails with ENOMEM on any unmapped page; check in chunks so a
    // huge registration does not need a huge vector.
    const uint64_t chunk_pages = 1u << 16;
    std::vector<unsigned char> vec(static_cast<size_t>(chunk_pages));
    for (uint64_t a = start; a < end;) {
        uint64_t pages = std::min<uint64_t>(chunk_pages, (end - a + p - 1) / p);
        if (::mincore(reinterpret_cast<void *>(a), pages * p, vec.data()) != 0) {
            if (errno == ENOMEM) return false;
            // EAGAIN and friends: be permissive, the kernel will still fault
            // cleanly (EFAULT) on socket I/O.
            return true;
        }
        a += pages * p;
    }
    return true;
}

std::string detect_host_location(const void *addr) {
    long page = ::sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    void *pages[1] = {reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(addr) &
                                               ~(static_cast<uintptr_t>(page) - 1))};
    int status[1] = {-1};
#ifdef SYS_move_pages
    long rc = ::syscall(SYS_move_pages, 0, 1UL, pages, nullptr, status, 0);
    if (rc == 0 && status[0] >= 0) return "cpu:" + std::to_string(status[0]);
#endif
    return "*";
}

void MemoryRegistry::check_new(uint64_t addr, uint64_t length) const {
    if (addr == 0) throw Error(kErrInvalidArgument, "cannot register a null address");
    if (length == 0)
        throw Error(kErrInvalidArgument, "cannot register zero bytes at " + hex(addr));
    if (addr + length < addr)
        throw Error(kErrInvalidArgument,
                    "range at " + hex(addr) + " of " + std::to_string(length) +
                        " bytes wraps around the address space");
    // First region starting at or after addr, and its predecessor.
    auto it = by_addr_.lower_bound(addr);
    if (it != by_addr_.end() && it->second->addr < addr + length)
        throw Error(kErrAddressOverlapped,
                    "range " + range_str(addr, length) + " overlaps the registered range " +
                        range_str(it->second->addr, it->second->length));
    if (it != by_addr_.begin()) {
        auto prev = std::prev(it);
        if (prev->second->end() > addr)
            throw Error(kErrAddressOverlapped,
                        "range " + range_str(addr, length) + " overlaps the registered range " +
                            range_str(prev->second->addr, prev->second->length));
    }
}

void MemoryRegistry::add(uint64_t addr, uint64_t length, const std::string &location,
                         bool remote_accessible) {
    add_batch({RegionInfo{addr, length, remote_accessible, location}});
}

void MemoryRegistry::add_batch(const std::vector<RegionInfo> &regions) {
    // Validate against each other first (sorted), then against the registry.
    std::vector<RegionInfo> sorted = regions;
    std::sort(sorted.begin(), sorted.end(),
              [](const RegionInfo &a, const RegionInfo &b) { return a.addr < b.addr; });
    for (size_t i = 0; i + 1 < sorted.size(); ++i) {
        if (sorted[i].addr + sorted[i].length > sorted[i + 1].addr)
            throw Error(kErrAddressOverlapped,
                        "ranges " + range_str(sorted[i].addr, sorted[i].length) + " and " +
                            range_str(sorted[i + 1].addr, sorted[i + 1].length) +
                            " in one batch overlap");
    }
    for (const auto &r : sorted) {
        // Device memory is not mapped into the host's page tables.
        if (r.device < 0 && r.addr != 0 && r.length != 0 && r.addr + r.length > r.addr &&
            !range_is_mapped(r.addr, r.length))
            throw Error(kErrInvalidArgument,
                        "range " + range_str(r.addr, r.length) +
                            " is not mapped in this process");
    }
    std::unique_lock<std::shared_mutex> g(mu_);
    for (const auto &r : sorted) check_new(r.addr, r.length);
    for (const auto &r : sorted) {
        auto reg = std::make_shared<Region>();
        reg->addr = r.addr;
        reg->length = r.length;
        reg->remote_accessible = r.remote_accessible;
        reg->location = r.location;
        reg->device = r.device;
        reg->ipc_handle = r.ipc_handle;
        reg->ipc_offset = r.ipc_offset;
        by_addr_.emplace(r.addr, std::move(reg));
    }
    ++generation_;
}

void MemoryRegistry::wait_unpinned(const std::shared_ptr<Region> &r) {
    std::unique_lock<std::mutex> g(r->mu);
    auto start = std::chrono::steady_clock::now();
    bool warned = false;
    while (r->pins.load(std::memory_order_acquire) != 0) {
        r->cv.wait_for(g, std::chrono::seconds(1));
        if (!warned && r->pins.load(std::memory_order_acquire) != 0 &&
            std::chrono::steady_clock::now() - start > std::chrono::seconds(2)) {
            warned = true;
            MC_LOG(Warn, "unregister of " << range_str(r->addr, r->length) << " waits for "
                                          << r->pins.load() << " in-flight transfer(s)");
        }
    }
}

void MemoryRegistry::remove(uint64_t addr) {
    std::shared_ptr<Region> r;
    {
        std::unique_lock<std::shared_mutex> g(mu_);
        auto it = by_addr_.find(addr);
        if (it == by_addr_.end())
            throw Error(kErrAddressNotRegistered,
                        "no registered buffer starts at " + hex(addr));
        r = it->second;
        by_addr_.erase(it);
        ++generation_;
    }
    wait_unpinned(r);
}

void MemoryRegistry::clear() {
    std::map<uint64_t, std::shared_ptr<Region>> old;
    {
        std::unique_lock<std::shared_mutex> g(mu_);
        old.swap(by_addr_);
        ++generation_;
    }
    for (auto &kv : old) wait_unpinned(kv.second);
}

RegionPin MemoryRegistry::pin(uint64_t addr, uint64_t len, bool need_remote) const {
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = by_addr_.upper_bound(addr);
    if (it == by_addr_.begin()) return RegionPin();
    --it;
    const auto &r = it->second;
    if (!range_within(addr, len, r->addr, r->length)) return RegionPin();
    if (need_remote && !r->remote_accessible) return RegionPin();
    return RegionPin(r);
}

bool MemoryRegistry::wait_idle(uint64_t addr, int64_t timeout_ms) const {
    std::shared_ptr<Region> r;
    {
        std::shared_lock<std::shared_mutex> g(mu_);
        auto it = by_addr_.find(addr);
        if (it == by_addr_.end())
            throw Error(kErrAddressNotRegistered, "no registered buffer starts at " + hex(addr));
        r = it->second;
    }
    std::unique_lock<std::mutex> g(r->mu);
    auto idle = [&] { return r->pins.load(std::memory_order_acquire) == 0; };
    if (timeout_ms < 0) {
        r->cv.wait(g, idle);
        return true;
    }
    return r->cv.wait_for(g, std::chrono::milliseconds(timeout_ms), idle);
}

std::vector<RegionInfo> MemoryRegistry::snapshot(bool remote_only) const {
    std::shared_lock<std::shared_mutex> g(mu_);
    std::vector<RegionInfo> out;
    out.reserve(by_addr_.size());
    for (const auto &kv : by_addr_) {
        const auto &r = kv.second;
        if (remote_only && !r->remote_accessible) continue;
        out.push_back(RegionInfo{r->addr, r->length, r->remote_accessible, r->location, r->device,
                                 r->ipc_handle, r->ipc_offset});
    }
    return out;
}

uint64_t MemoryRegistry::generation() const {
    std::shared_lock<std::shared_mutex> g(mu_);
    return generation_;
}

size_t MemoryRegistry::size() const {
    std::shared_lock<std::shared_mutex> g(mu_);
    return by_addr_.size();
}

}  // namespace mcrs
