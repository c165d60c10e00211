// The one range check for addresses a peer names: [addr, addr + len) lies
// wholly inside [base, base + base_len), with no arithmetic that can wrap.
// Every path that turns a peer's address into memory access uses it: the
// registry's pin (TCP and same-host targets), the RDMA and CUDA IPC
// initiators against the peer's published buffers, the CUDA IPC initiator
// against the size the driver mapped (the peer's mc_cuda_ipc_offset is only
// its word), and the descriptor's host-buffer lookup.
#pragma once

#include <cstdint>

namespace mcrs {

constexpr bool range_within(uint64_t addr, uint64_t len, uint64_t base, uint64_t base_len) {
    return len != 0 && addr >= base && addr - base <= base_len && len <= base_len - (addr - base);
}

}  // namespace mcrs
