// The CUDA IPC handle as the descriptor's mc_cuda_ipc key carries it: 128
// lowercase hex digits. Shared by the engine and the GPU bench so both read
// peers' handles the same strict way (docs/wire-protocol.md, CUDA IPC handles).
#pragma once

#include <string>

#include "gpu/cuda_api.h"

#if MC_WITH_CUDA
namespace mcrs {
namespace gpu {

std::string format_ipc_handle(const cudaIpcMemHandle_t &h);
// False for any other length or a non-hex digit.
bool parse_ipc_handle(const std::string &hex, cudaIpcMemHandle_t &out);

}  // namespace gpu
}  // namespace mcrs
#endif
