// GPU memory registration for RDMA (docs/wire-protocol.md, RDMA GPU memory
// registration): WITH_NVIDIA_PEERMEM, resolving GpuRegistrationMode::Auto
// from what the host offers, and the text of registration failures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/config.h"

namespace mcrs::rdma {

// PeermemSetting and WITH_NVIDIA_PEERMEM parsing: core/config.h.

// Is a GPUDirect peer-memory client loaded? True when <sys_module_root>/
// nvidia_peermem (or the legacy nv_peer_mem) exists, or /proc/modules lists
// either name. Roots injectable for tests.
bool peermem_module_loaded(const std::string &sys_module_root = "/sys/module",
                           const std::string &proc_modules = "/proc/modules");

struct RegistrationChoice {
    GpuRegistrationMode mode = GpuRegistrationMode::PeerMem;  // PeerMem or DmaBuf
    std::string reason;
};

// The registration path for GPU memory of one GPU.
//   configured  peermem loaded  GPU DMA-BUF   -> path
//   PeerMem     any             any           -> PeerMem
//   DmaBuf      any             any           -> DmaBuf (fails clearly if unsupported)
//   FromEnv     any             any           -> WITH_NVIDIA_PEERMEM (see above)
//   Auto        yes             any           -> PeerMem (the module is there: upstream's
//                                                default path, parallel registration)
//   Auto        no              yes           -> DmaBuf (needs no kernel module)
//   Auto        no              no            -> PeerMem (nothing better; the failure
//                                                message then says what is missing)
RegistrationChoice resolve_registration(GpuRegistrationMode configured, bool peermem_loaded,
                                        bool dmabuf_supported);

enum class RegPath { HostRegMr, PeerMemRegMr, DmaBufRegMr };
const char *reg_path_call(RegPath p);  // "ibv_reg_mr" / "ibv_reg_dmabuf_mr"

// "Failed to register memory 0x...(+len) on <device> via <path> (<call>):
// <strerror> [<errno>]. <hint>". Hints: EFAULT on the PeerMem path ->
// load nvidia-peermem (`modprobe nvidia-peermem`) or set
// WITH_NVIDIA_PEERMEM=0 (or GpuRegistrationMode::DmaBuf / Auto in the API);
// EOPNOTSUPP/ENOTSUP/ENOSYS/EPROTONOSUPPORT on the DMA-BUF path -> the NIC
// driver/kernel lacks DMA-BUF MRs, use nvidia-peermem; ENOMEM -> memlock
// limit; EACCES/EPERM -> access flags / permissions.
std::string registration_failure_message(RegPath path, int err, uint64_t addr, uint64_t length,
                                         const std::string &device);

}  // namespace mcrs::rdma
