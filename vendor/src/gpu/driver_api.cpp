// The few CUDA driver API calls the runtime API does not offer (allocation
// ranges, DMA-BUF export, device attributes, PCI bus ids), resolved from libcuda.so.1 at
// run time, so nothing links against the driver library.
#include <dlfcn.h>

#include <mutex>

#include "common/error.h"
#include "common/range.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu.h"

namespace mcrs {
namespace gpu {

#if MC_WITH_CUDA

namespace {

struct Driver {
    bool loaded = false;
    std::string error;
    CUresult (*init)(unsigned int) = nullptr;
    CUresult (*get_error_string)(CUresult, const char **) = nullptr;
    CUresult (*device_get)(CUdevice *, int) = nullptr;
    CUresult (*device_get_count)(int *) = nullptr;
    CUresult (*device_get_pci_bus_id)(char *, int, CUdevice) = nullptr;
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice) = nullptr;
    CUresult (*mem_get_address_range)(CUdeviceptr *, size_t *, CUdeviceptr) = nullptr;
    CUresult (*mem_get_handle_for_address_range)(void *, CUdeviceptr, size_t, CUmemRangeHandleType,
                                                 unsigned long long) = nullptr;
};

template <class F>
bool sym(void *lib, const char *name, F &fn, std::string &err) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (!fn) err = std::string("libcuda.so.1 lacks ") + name + " (driver too old?)";
    return fn != nullptr;
}

const Driver &driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            d.error = std::string("cannot load the CUDA driver library libcuda.so.1: ") + dlerror();
            return;
        }
        std::string err;
        bool ok = sym(lib, "cuInit", d.init, err) && sym(lib, "cuGetErrorString", d.get_error_string, err) &&
                  sym(lib, "cuDeviceGet", d.device_get, err) &&
                  sym(lib, "cuDeviceGetCount", d.device_get_count, err) &&
                  sym(lib, "cuDeviceGetPCIBusId", d.device_get_pci_bus_id, err) &&
                  sym(lib, "cuDeviceGetAttribute", d.device_get_attribute, err) &&
                  sym(lib, "cuMemGetAddressRange_v2", d.mem_get_address_range, err) &&
                  sym(lib, "cuMemGetHandleForAddressRange", d.mem_get_handle_for_address_range, err);
        if (!ok) {
            d.error = err;
            return;
        }
        CUresult r = d.init(0);
        if (r != CUDA_SUCCESS) {
            d.error = "cuInit failed with CUresult " + std::to_string(static_cast<int>(r));
            return;
        }
        d.loaded = true;
    });
    return d;
}

std::string cu_err(const Driver &d, CUresult r) {
    const char *s = nullptr;
    if (d.get_error_string) d.get_error_string(r, &s);
    return std::string(s ? s : "unknown error") + " (CUresult " + std::to_string(static_cast<int>(r)) + ")";
}

}  // namespace

bool allocation_range(const void *ptr, uint64_t &base, uint64_t &size, std::string &err) {
    const Driver &d = driver();
    if (!d.loaded) {
        err = d.error;
        return false;
    }
    CUdeviceptr b = 0;
    size_t sz = 0;
    CUresult r = d.mem_get_address_range(&b, &sz, reinterpret_cast<CUdeviceptr>(ptr));
    if (r != CUDA_SUCCESS) {
        err = "cuMemGetAddressRange: " + cu_err(d, r);
        return false;
    }
    base = static_cast<uint64_t>(b);
    size = sz;
    return true;
}

bool driver_pci_bus_ids(std::vector<std::string> &out, std::string &err) {
    out.clear();
    const Driver &d = driver();
    if (!d.loaded) {
        err = d.error;
        return false;
    }
    int n = 0;
    CUresult r = d.device_get_count(&n);
    if (r != CUDA_SUCCESS) {
        err = "cuDeviceGetCount: " + cu_err(d, r);
        return false;
    }
    for (int i = 0; i < n; ++i) {
        CUdevice dev;
        char buf[64] = {0};
        r = d.device_get(&dev, i);
        if (r == CUDA_SUCCESS) r = d.device_get_pci_bus_id(buf, static_cast<int>(sizeof buf - 1), dev);
        if (r != CUDA_SUCCESS) {
            err = "cuDeviceGetPCIBusId(" + std::to_string(i) + "): " + cu_err(d, r);
            out.clear();
            return false;
        }
        out.emplace_back(buf);
    }
    return true;
}

bool dmabuf_supported(int device) {
    const Driver &d = driver();
    if (!d.loaded || !status().usable) return false;
    CUdevice dev;
    if (d.device_get(&dev, device) != CUDA_SUCCESS) return false;
    int v = 0;
    if (d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) != CUDA_SUCCESS) return false;
    return v != 0;
}

void dmabuf_export(const void *ptr, size_t len, DmabufExport &out) {
    require_usable("DMA-BUF export");
    PointerKind k = classify(ptr);
    if (!k.device) throw Error(kErrInvalidArgument, "DMA-BUF export: the pointer is not device memory");
    const Driver &d = driver();
    if (!d.loaded) throw Error(kErrContext, "DMA-BUF export: " + d.error);
    if (!dmabuf_supported(k.ordinal))
        throw Error(kErrNotImplemented, "DMA-BUF export: GPU " + std::to_string(k.ordinal) +
                                            " does not support DMA-BUF (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0); "
                                            "use nvidia-peermem (WITH_NVIDIA_PEERMEM=1)");
    std::string err;
    uint64_t base = 0, size = 0;
    if (!allocation_range(ptr, base, size, err)) throw Error(kErrContext, "DMA-BUF export: " + err);
    const uint64_t p = reinterpret_cast<uint64_t>(ptr);
    if (!range_within(p, len, base, size))
        throw Error(kErrInvalidArgument, "DMA-BUF export: the range runs past the end of its allocation");
    cudaSetDevice(k.ordinal);
    int fd = -1;
    // Upstream passes flags 0: the PCIe-mapping flag is refused by some GPUs.
    CUresult r = d.mem_get_handle_for_address_range(&fd, static_cast<CUdeviceptr>(base), size,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS || fd < 0)
        throw Error(kErrContext, "cuMemGetHandleForAddressRange: " + cu_err(d, r));
    out.fd = fd;
    out.device = k.ordinal;
    out.base = base;
    out.size = size;
    out.offset = p - base;
}

#else

bool allocation_range(const void *, uint64_t &, uint64_t &, std::string &err) {
    err = status().reason;
    return false;
}
bool dmabuf_supported(int) { return false; }
bool driver_pci_bus_ids(std::vector<std::string> &out, std::string &err) {
    out.clear();
    err = status().reason;
    return false;
}
void dmabuf_export(const void *, size_t, DmabufExport &) { require_usable("DMA-BUF export"); }

#endif

}  // namespace gpu
}  // namespace mcrs
