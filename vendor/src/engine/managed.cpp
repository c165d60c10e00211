// Engine-allocated ("managed") buffers and one-call synchronous transfers:
// what upstream's Python binding offers beside the C API.
#include <sys/mman.h>

#include "common/error.h"
#include "common/log.h"
#include "common/text.h"
#include "engine/transfer_engine.h"

namespace mcrs {

namespace {
// Far above any real request, low enough that the size arithmetic of the
// registry and transports cannot overflow.
constexpr size_t kMaxManagedBytes = size_t(1) << 46;  // 64 TiB
}  // namespace

void *TransferEngine::alloc_managed(size_t len, const std::string &location) {
    if (len == 0) throw Error(kErrInvalidArgument, "a managed buffer needs a length of at least 1 byte");
    if (len > kMaxManagedBytes)
        throw Error(kErrInvalidArgument, "managed buffer of " + std::to_string(len) +
                                             " bytes is above the limit of " + std::to_string(kMaxManagedBytes));
    void *p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(kErrMemory, "cannot map a managed buffer of " + std::to_string(len) + " bytes");
    try {
        register_memory(p, len, location, /*remote=*/true);
    } catch (...) {
        ::munmap(p, len);
        throw;
    }
    std::lock_guard<std::mutex> g(managed_mu_);
    managed_[reinterpret_cast<uint64_t>(p)] = len;
    return p;
}

void TransferEngine::free_managed(void *addr, size_t len) {
    uint64_t a = reinterpret_cast<uint64_t>(addr);
    {
        std::lock_guard<std::mutex> g(managed_mu_);
        auto it = managed_.find(a);
        if (it == managed_.end())
            throw Error(kErrAddressNotRegistered, hex(a) + " is not a managed buffer of this engine");
        if (it->second != len)
            throw Error(kErrInvalidArgument, "managed buffer " + hex(a) + " has " + std::to_string(it->second) +
                                                 " bytes, not " + std::to_string(len));
        managed_.erase(it);
    }
    // Waits for transfers touching it; only then is the memory unmapped.
    try {
        unregister_memory(addr);
    } catch (const Error &e) {
        // Unregistered by hand already: nothing touches it any more.
        if (e.code() != kErrAddressNotRegistered) {
            std::lock_guard<std::mutex> g(managed_mu_);
            managed_[a] = len;  // still registered: keep it ours
            throw;
        }
    }
    ::munmap(addr, len);
}

void TransferEngine::release_managed() {
    // The registry is already cleared (every transport stopped): unmapping
    // is all that is left.
    std::lock_guard<std::mutex> g(managed_mu_);
    for (const auto &kv : managed_) ::munmap(reinterpret_cast<void *>(kv.first), kv.second);
    managed_.clear();
}

void TransferEngine::transfer_sync(const std::string &target, int opcode, void *local, uint64_t remote,
                                   uint64_t len) {
    int32_t seg = open_segment(target, false);
    uint64_t b = allocate_batch(1);
    Request r{opcode, local, seg, remote, len};
    try {
        submit(b, &r, 1, nullptr);
    } catch (...) {
        free_batch(b);
        throw;
    }
    // Every transport ends each request (its own timeouts), so this returns.
    wait_batch(b, -1);
    uint64_t bytes = 0;
    int st = task_status(b, 0, &bytes);
    std::string why = st == kTaskCompleted ? std::string() : task_error(b, 0);
    free_batch(b);
    if (st != kTaskCompleted)
        throw Error(kErrTransferFailed, std::string(opcode == kOpRead ? "read" : "write") + " of " +
                                            std::to_string(len) + " bytes from segment '" + target +
                                            "' failed: " + (why.empty() ? "status " + std::to_string(st) : why));
}

}  // namespace mcrs
