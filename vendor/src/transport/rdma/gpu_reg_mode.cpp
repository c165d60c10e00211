#include "transport/rdma/gpu_reg_mode.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "common/text.h"
#include "common/log.h"
#include "transport/rdma/sysfs_reader.h"

namespace mcrs::rdma {

bool peermem_module_loaded(const std::string &sys_module_root, const std::string &proc_modules) {
    for (const char *m : {"nvidia_peermem", "nv_peer_mem"}) {
        struct stat st;
        if (::stat((sys_module_root + "/" + m).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return true;
    }
    auto text = read_sysfs_text(proc_modules, size_t(4) << 20);
    if (!text) return false;
    size_t start = 0;
    while (start < text->size()) {
        size_t nl = text->find('\n', start);
        if (nl == std::string::npos) nl = text->size();
        size_t sp = text->find(' ', start);
        std::string name = text->substr(start, (sp == std::string::npos || sp > nl ? nl : sp) - start);
        if (name == "nvidia_peermem" || name == "nv_peer_mem") return true;
        start = nl + 1;
    }
    return false;
}

RegistrationChoice resolve_registration(GpuRegistrationMode configured, bool peermem_loaded,
                                        bool dmabuf_supported) {
    RegistrationChoice c;
    switch (configured) {
        case GpuRegistrationMode::PeerMem:
            c.mode = GpuRegistrationMode::PeerMem;
            c.reason = "GpuRegistrationMode::PeerMem";
            return c;
        case GpuRegistrationMode::DmaBuf:
            c.mode = GpuRegistrationMode::DmaBuf;
            c.reason = "GpuRegistrationMode::DmaBuf";
            return c;
        case GpuRegistrationMode::FromEnv: {
            PeermemSetting s = with_nvidia_peermem_from_env();
            c.mode = s.value ? GpuRegistrationMode::PeerMem : GpuRegistrationMode::DmaBuf;
            c.reason = s.value ? "WITH_NVIDIA_PEERMEM is 1 (default)" : "WITH_NVIDIA_PEERMEM=0";
            return c;
        }
        case GpuRegistrationMode::Auto:
        default:
            break;
    }
    if (peermem_loaded) {
        c.mode = GpuRegistrationMode::PeerMem;
        c.reason = "Auto: the nvidia_peermem kernel module is loaded";
    } else if (dmabuf_supported) {
        c.mode = GpuRegistrationMode::DmaBuf;
        c.reason = "Auto: nvidia_peermem is not loaded and the GPU supports DMA-BUF";
    } else {
        c.mode = GpuRegistrationMode::PeerMem;
        c.reason = "Auto: neither nvidia_peermem nor GPU DMA-BUF support is available; trying ibv_reg_mr";
    }
    return c;
}

const char *reg_path_call(RegPath p) {
    return p == RegPath::DmaBufRegMr ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr";
}

std::string registration_failure_message(RegPath path, int err, uint64_t addr, uint64_t length,
                                         const std::string &device) {
    const char *label = path == RegPath::HostRegMr      ? "host memory"
                        : path == RegPath::PeerMemRegMr ? "GPU memory via nvidia-peermem"
                                                        : "GPU memory via DMA-BUF";
    char where[64];
    std::snprintf(where, sizeof where, "%#llx (%llu bytes)", static_cast<unsigned long long>(addr),
                  static_cast<unsigned long long>(length));
    std::string msg = std::string("Failed to register memory ") + where + " on " + device + ": " +
                      label + " (" + reg_path_call(path) + ") failed: " +
                      std::error_code(err, std::generic_category()).message() + " [" +
                      std::to_string(err) + "].";
    if (path == RegPath::PeerMemRegMr && err == EFAULT) {
        msg += " The kernel could not pin the GPU pages: the nvidia-peermem module is probably "
               "not loaded. Load it (`modprobe nvidia-peermem`), or set WITH_NVIDIA_PEERMEM=0 to "
               "register through DMA-BUF instead (in the API: GpuRegistrationMode::DmaBuf or "
               "GpuRegistrationMode::Auto).";
    } else if (path == RegPath::DmaBufRegMr &&
               (err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS || err == EPROTONOSUPPORT)) {
        msg += " The RDMA driver or kernel does not support DMA-BUF memory regions; load "
               "nvidia-peermem and set WITH_NVIDIA_PEERMEM=1 (or GpuRegistrationMode::PeerMem).";
    } else if (err == ENOMEM) {
        msg += " Check the locked-memory limit (`ulimit -l`, should be unlimited) and free memory.";
    } else if (err == EACCES || err == EPERM) {
        msg += " The device refused the access flags or the process lacks permission on the "
               "RDMA device.";
    } else if (path == RegPath::HostRegMr && err == EFAULT) {
        msg += " The address range is not mapped in this process.";
    }
    return msg;
}

}  // namespace mcrs::rdma
