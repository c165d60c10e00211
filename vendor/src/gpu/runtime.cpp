#include <mutex>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu.h"

namespace mcrs {
namespace gpu {

#if MC_WITH_CUDA

namespace {

std::string version_str(int v) {
    if (v <= 0) return "none";
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string cuda_err(cudaError_t e) {
    const char *name = cudaGetErrorName(e);
    const char *text = cudaGetErrorString(e);
    return std::string(text ? text : "?") + " (" + (name ? name : "?") + ")";
}

}  // namespace

int build_major() { return MC_CUDA_MAJOR; }

const Status &status() {
    static Status s;
    static std::once_flag once;
    std::call_once(once, [] {
        cudaDriverGetVersion(&s.driver_version);
        cudaRuntimeGetVersion(&s.runtime_version);
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        std::ostringstream why;
        if (e != cudaSuccess || n == 0) {
            why << "GPU memory is not available: this engine was built for CUDA " << MC_CUDA_MAJOR
                << " (runtime " << version_str(s.runtime_version) << ") and ";
            if (s.driver_version == 0)
                why << "no CUDA driver (libcuda.so.1) was found";
            else if (e == cudaErrorInsufficientDriver)
                why << "the driver supports CUDA " << version_str(s.driver_version)
                    << ", older than this build needs; update the driver or build with the "
                       "feature for the driver's CUDA major";
            else if (e != cudaSuccess)
                why << "cudaGetDeviceCount failed: " << cuda_err(e) << " (driver supports CUDA "
                    << version_str(s.driver_version) << ")";
            else
                why << "no GPU is visible (driver supports CUDA " << version_str(s.driver_version) << ")";
            s.reason = why.str();
            cudaGetLastError();
            MC_LOG(Info, s.reason);
            return;
        }
        s.usable = true;
        s.device_count = n;
        MC_LOG(Info, "CUDA " << MC_CUDA_MAJOR << " build, runtime " << version_str(s.runtime_version)
                             << ", driver " << version_str(s.driver_version) << ", " << n << " GPU(s)");
    });
    return s;
}

void require_usable(const char *what) {
    const Status &s = status();
    if (!s.usable) throw Error(kErrContext, std::string(what) + ": " + s.reason);
}

PointerKind classify(const void *ptr) {
    PointerKind k;
    if (!ptr || !status().usable) return k;
    cudaPointerAttributes a{};
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error for this thread
        return k;
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
        k.device = a.type == cudaMemoryTypeDevice;
        k.ordinal = a.device;
    }
    return k;
}

void copy(void *dst, const void *src, size_t n) {
    require_usable("GPU copy");
    // cudaMemcpy returns before a device-to-device copy has finished; a
    // transfer is complete only when the bytes are there, for every reader
    // (a NIC, another process, another stream). The per-thread stream keeps
    // other threads' copies and the caller's streams out of the wait.
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess) throw Error(kErrContext, "cudaMemcpy of " + std::to_string(n) + " bytes failed: " + cuda_err(e));
}

void memset_device(void *dst, int value, size_t n, int device) {
    require_usable("GPU memset");
    cudaSetDevice(device);
    cudaError_t e = cudaMemset(dst, value, n);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) throw Error(kErrContext, "cudaMemset failed: " + cuda_err(e));
}

void *alloc_device(int device, size_t n) {
    require_usable("GPU allocation");
    if (device < 0 || device >= status().device_count)
        throw Error(kErrInvalidArgument, "GPU " + std::to_string(device) + " does not exist (" +
                                             std::to_string(status().device_count) + " visible)");
    cudaSetDevice(device);
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess)
        throw Error(kErrMemory, "cudaMalloc of " + std::to_string(n) + " bytes on GPU " + std::to_string(device) +
                                    " failed: " + cuda_err(e));
    return p;
}

void free_device(void *ptr, int device) {
    if (!ptr || !status().usable) return;
    cudaSetDevice(device);
    cudaFree(ptr);
}

void *alloc_pinned(size_t n) {
    require_usable("pinned allocation");
    void *p = nullptr;
    cudaError_t e = cudaMallocHost(&p, n);
    if (e != cudaSuccess) throw Error(kErrMemory, "cudaMallocHost of " + std::to_string(n) + " bytes failed: " + cuda_err(e));
    return p;
}

void free_pinned(void *ptr) {
    if (ptr && status().usable) cudaFreeHost(ptr);
}

#else  // CPU build

namespace {
const char *kNoCuda =
    "GPU memory is not available: this engine was built without CUDA (build mooncake-sys with the cuda12 or "
    "cuda13 feature)";
}

int build_major() { return 0; }

const Status &status() {
    static const Status s = [] {
        Status x;
        x.reason = kNoCuda;
        return x;
    }();
    return s;
}

void require_usable(const char *what) { throw Error(kErrNotImplemented, std::string(what) + ": " + kNoCuda); }
PointerKind classify(const void *) { return PointerKind{}; }
void copy(void *, const void *, size_t) { require_usable("GPU copy"); }
void memset_device(void *, int, size_t, int) { require_usable("GPU memset"); }
void *alloc_device(int, size_t) {
    require_usable("GPU allocation");
    return nullptr;
}
void free_device(void *, int) {}
void *alloc_pinned(size_t) {
    require_usable("pinned allocation");
    return nullptr;
}
void free_pinned(void *) {}

#endif

}  // namespace gpu
}  // namespace mcrs
