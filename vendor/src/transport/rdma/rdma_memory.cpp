// RdmaTransport's memory registration: one MR per NIC for every region,
// host memory through ibv_reg_mr, GPU memory through nvidia-peermem or a
// dma-buf export (MC's GPU registration mode), and the lkey lookup the data
// path uses.
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <string>

#include "common/error.h"
#include "gpu/gpu.h"
#include "transport/rdma/gpu_reg_mode.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_transport_internal.h"

namespace mcrs::rdma {

void RdmaTransport::register_region(uint64_t addr, uint64_t len, int device, bool remote,
                                    const std::string &location) {
    // Only remote-accessible buffers get remote access: the NIC itself then
    // refuses a peer's READ or WRITE of a local-only buffer, even one that
    // learned or guessed its key.
    int access = ibv::IBV_ACCESS_LOCAL_WRITE;
    if (remote) access |= ibv::IBV_ACCESS_REMOTE_WRITE | ibv::IBV_ACCESS_REMOTE_READ;
    if (lib_->supports_relaxed_ordering()) access |= ibv::IBV_ACCESS_RELAXED_ORDERING;
    Reg reg;
    reg.len = len;
    reg.remote = remote;
    reg.location = location.empty() ? "*" : location;
    RegPath path = RegPath::HostRegMr;
    gpu::DmabufExport dx;
    if (device >= 0) {
        GpuRegistrationMode mode = opt_.gpu_mode;
        if (mode == GpuRegistrationMode::FromEnv)
            mode = with_nvidia_peermem_from_env().value ? GpuRegistrationMode::PeerMem
                                                        : GpuRegistrationMode::DmaBuf;
        if (mode == GpuRegistrationMode::Auto)
            mode = resolve_registration(mode, peermem_module_loaded(), gpu::dmabuf_supported(device)).mode;
        path = mode == GpuRegistrationMode::DmaBuf ? RegPath::DmaBufRegMr : RegPath::PeerMemRegMr;
        if (path == RegPath::DmaBufRegMr) {
            gpu::dmabuf_export(reinterpret_cast<void *>(addr), len, dx);
            reg.dmabuf_fd = dx.fd;
        }
    }
    for (auto &c : ctxs_) {
        ibv::mr *m = nullptr;
        if (path == RegPath::DmaBufRegMr)
            m = lib_->reg_dmabuf_mr(c->pd, dx.offset, len, addr, dx.fd, access);
        else
            m = lib_->reg_mr(c->pd, reinterpret_cast<void *>(addr), len, access);
        if (!m) {
            int err = errno;
            for (auto *x : reg.mrs) lib_->api().dereg_mr(x);
            if (reg.dmabuf_fd >= 0) ::close(reg.dmabuf_fd);
            throw Error(kErrMemory, registration_failure_message(path, err, addr, len, c->name));
        }
        reg.mrs.push_back(m);
    }
    std::lock_guard<std::mutex> g(reg_mu_);
    regs_[addr] = std::move(reg);
}

void RdmaTransport::deregister_region(uint64_t addr) {
    Reg reg;
    {
        std::lock_guard<std::mutex> g(reg_mu_);
        auto it = regs_.find(addr);
        if (it == regs_.end()) return;
        reg = std::move(it->second);
        regs_.erase(it);
    }
    for (auto *m : reg.mrs)
        if (m) lib_->api().dereg_mr(m);
    if (reg.dmabuf_fd >= 0) ::close(reg.dmabuf_fd);
}

bool RdmaTransport::find_lkey(uint64_t addr, uint64_t len, size_t nic, uint32_t &lkey) const {
    std::lock_guard<std::mutex> g(reg_mu_);
    auto r = regs_.upper_bound(addr);
    if (r != regs_.begin()) --r;
    if (r != regs_.end() && addr >= r->first && addr + len <= r->first + r->second.len) {
        lkey = r->second.mrs[nic]->lkey;
        return true;
    }
    return false;
}

}  // namespace mcrs::rdma
