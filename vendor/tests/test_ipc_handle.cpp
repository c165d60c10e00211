// The CUDA IPC handle codec (descriptor key mc_cuda_ipc), in CUDA builds.
// Needs no GPU: it runs in CI's CUDA builds, where a malformed handle from a
// peer must be refused before it reaches cudaIpcOpenMemHandle.
#include <string>

#include "engine_fixture.h"
#include "gpu/ipc_handle.h"

#if MC_WITH_CUDA

TEST(ipc_handle_codec_roundtrip_and_rejects) {
    cudaIpcMemHandle_t h{};
    for (size_t i = 0; i < sizeof h.reserved; ++i) h.reserved[i] = static_cast<char>(i * 37 + 200);
    std::string hex = mcrs::gpu::format_ipc_handle(h);
    CHECK_EQ(hex.size(), 2 * sizeof h.reserved);
    CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
    cudaIpcMemHandle_t back{};
    REQUIRE(mcrs::gpu::parse_ipc_handle(hex, back));
    for (size_t i = 0; i < sizeof h.reserved; ++i) CHECK_EQ(back.reserved[i], h.reserved[i]);
    // A peer's garbage: wrong length, upper case, non-hex, empty.
    CHECK(!mcrs::gpu::parse_ipc_handle(hex.substr(1), back));
    CHECK(!mcrs::gpu::parse_ipc_handle(hex + "0", back));
    std::string upper = hex;
    upper[0] = 'A';
    CHECK(!mcrs::gpu::parse_ipc_handle(upper, back));
    std::string junk = hex;
    junk[77] = 'g';
    CHECK(!mcrs::gpu::parse_ipc_handle(junk, back));
    CHECK(!mcrs::gpu::parse_ipc_handle("", back));
}

#endif
