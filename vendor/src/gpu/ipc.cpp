// CUDA IPC handles for the same-host GPU path: the owner exports the
// allocation behind a registered buffer, a peer process maps it and copies
// with the copy engines, without the network.
#include <cstdio>
#include <map>
#include <mutex>

#include "gpu/cuda_api.h"
#include "gpu/gpu.h"
#include "gpu/ipc_handle.h"

namespace mcrs {
namespace gpu {

#if MC_WITH_CUDA

std::string format_ipc_handle(const cudaIpcMemHandle_t &h) {
    static const char *digits = "0123456789abcdef";
    std::string hex;
    hex.reserve(2 * sizeof h.reserved);
    for (char ch : h.reserved) {
        auto c = static_cast<unsigned char>(ch);
        hex.push_back(digits[c >> 4]);
        hex.push_back(digits[c & 15]);
    }
    return hex;
}

bool parse_ipc_handle(const std::string &hex, cudaIpcMemHandle_t &out) {
    if (hex.size() != 2 * sizeof out.reserved) return false;
    auto nib = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    for (size_t i = 0; i < sizeof out.reserved; ++i) {
        int hi = nib(hex[2 * i]), lo = nib(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out.reserved[i] = static_cast<char>(hi << 4 | lo);
    }
    return true;
}

bool ipc_export(const void *ptr, IpcExport &out, std::string &err) {
    PointerKind k = classify(ptr);
    if (!k.device) {
        err = "not device memory";
        return false;
    }
    uint64_t base = 0, size = 0;
    if (!allocation_range(ptr, base, size, err)) return false;
    cudaSetDevice(k.ordinal);
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(base));
    if (e != cudaSuccess) {
        cudaGetLastError();
        err = std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(e);
        return false;
    }
    out.handle_hex = format_ipc_handle(h);
    out.offset = reinterpret_cast<uint64_t>(ptr) - base;
    out.device = k.ordinal;
    return true;
}

namespace {

// A process maps a peer allocation once: the driver refuses a second
// cudaIpcOpenMemHandle of a handle this process holds open ("resource
// already mapped"), and two engines of one process (one per TP rank) or
// two workers of one engine reach for the same decode cache. Opens are
// serialized (they take milliseconds and happen once per allocation);
// each holder counts, and the last close unmaps.
struct OpenMapping {
    IpcMapping mapping;
    int holders;
};
std::mutex g_open_mu;
std::map<std::string, OpenMapping> &open_mappings() {
    static auto *m = new std::map<std::string, OpenMapping>();  // outlives static destructors
    return *m;
}

}  // namespace

bool ipc_open(const std::string &handle_hex, int device, IpcMapping &out, std::string &err) {
    if (!status().usable) {
        err = status().reason;
        return false;
    }
    cudaIpcMemHandle_t h;
    if (!parse_ipc_handle(handle_hex, h)) {
        err = "malformed CUDA IPC handle";
        return false;
    }
    std::lock_guard<std::mutex> g(g_open_mu);
    auto &open = open_mappings();
    auto it = open.find(handle_hex);
    if (it != open.end()) {
        ++it->second.holders;
        out = it->second.mapping;
        return true;
    }
    // Map on a local GPU: the peer's device when we have it, else ours.
    int local = device >= 0 && device < status().device_count ? device : 0;
    cudaSetDevice(local);
    void *p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        cudaGetLastError();
        err = std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e);
        return false;
    }
    // The size comes from the driver, never from the peer: it bounds every
    // offset the peer's descriptor names.
    uint64_t base = 0, size = 0;
    if (!allocation_range(p, base, size, err) || base != reinterpret_cast<uint64_t>(p) || size == 0) {
        cudaIpcCloseMemHandle(p);
        if (err.empty()) err = "the mapped allocation's range is not what the driver reported";
        err = "sizing a mapped peer allocation: " + err;
        return false;
    }
    out = IpcMapping{p, local, size};
    open.emplace(handle_hex, OpenMapping{out, 1});
    return true;
}

void ipc_close(const IpcMapping &m) {
    if (!m.base || !status().usable) return;
    std::lock_guard<std::mutex> g(g_open_mu);
    auto &open = open_mappings();
    for (auto it = open.begin(); it != open.end(); ++it) {
        if (it->second.mapping.base != m.base) continue;
        if (--it->second.holders > 0) return;
        open.erase(it);
        break;
    }
    cudaSetDevice(m.device >= 0 ? m.device : 0);
    cudaIpcCloseMemHandle(m.base);
}

#else

bool ipc_export(const void *, IpcExport &, std::string &err) {
    err = status().reason;
    return false;
}
bool ipc_open(const std::string &, int, IpcMapping &, std::string &err) {
    err = status().reason;
    return false;
}
void ipc_close(const IpcMapping &) {}

#endif

}  // namespace gpu
}  // namespace mcrs
