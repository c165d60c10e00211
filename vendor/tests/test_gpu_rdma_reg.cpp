// RDMA registration of real GPU memory (GPU lane, MOONCAKE_GPU_TESTS=1).
// No machine here has an RDMA NIC, so the NICs are the softverbs stand-in;
// the GPU, the CUDA driver and the DMA-BUF fds it exports are real. What
// this shows: which registration path each mode takes on this host, that
// the DMA-BUF path hands every NIC the same live DMA-BUF fd covering the
// whole buffer, and that unregistering closes it. What it cannot show: a
// real NIC mapping GPU memory (the stand-in never touches the pages).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "gpu/gpu.h"
#include "gpu_lane.h"
#include "rdma_engine_fixture.h"
#include "transport/rdma/gpu_reg_mode.h"

using namespace mctest;
using namespace rdmatest;
using mcrs::GpuRegistrationMode;

namespace {

// Does fd name a DMA-BUF now ("/dmabuf:..." or "anon_inode:dmabuf")?
bool names_dmabuf(int fd) {
    char link[64], target[256];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return false;
    target[n] = 0;
    return std::strstr(target, "dmabuf") != nullptr;
}

struct MrSeen {
    bool found = false;
    mc_softverbs_mr_info info{};
};

MrSeen mr_of(const char *dev, const void *p) {
    MrSeen s;
    s.found = svtest::sv().find_mr(dev, reinterpret_cast<uint64_t>(p), &s.info) == 0;
    return s;
}

// Registers `d` with `mode` on an engine over two stand-in NICs and checks
// what both NICs were given. Returns true when the DMA-BUF path was taken.
bool register_and_check(const DeviceBuf &d, GpuRegistrationMode mode) {
    EngineConfig c = rdma_cfg({});
    c.gpu_registration_mode = mode;
    TransferEngine e(c);
    e.register_memory(d.ptr, d.len, "cuda:0", true);
    MrSeen a = mr_of("sv0", d.at(4096)), b = mr_of("sv1", d.at(d.len - 1));
    REQUIRE(a.found && b.found);
    CHECK_EQ(a.info.length, static_cast<uint64_t>(d.len));
    CHECK_EQ(a.info.dmabuf, b.info.dmabuf);
    bool dmabuf = a.info.dmabuf != 0;
    int fd = a.info.fd;
    if (dmabuf) {
        // One export shared by all NICs, really a DMA-BUF at registration.
        CHECK(fd >= 0);
        CHECK_EQ(a.info.fd, b.info.fd);
        CHECK_EQ(a.info.offset, b.info.offset);
        CHECK(a.info.fd_is_dmabuf && b.info.fd_is_dmabuf);
        CHECK(names_dmabuf(fd));
    } else {
        CHECK_EQ(fd, -1);
    }
    // Published for peers: one rkey per NIC, at the GPU's location.
    mcrs::SegmentDesc desc = e.local_descriptor();
    REQUIRE_EQ(desc.buffers.size(), 1u);
    CHECK_EQ(desc.buffers[0].name, std::string("cuda:0"));
    CHECK_EQ(desc.buffers[0].rkey.size(), 2u);
    e.unregister_memory(d.ptr);
    CHECK(!mr_of("sv0", d.at(4096)).found);
    // The export is closed with the registration (no fd leak). The number
    // may be reused at once by another open, but never by a DMA-BUF of ours.
    if (dmabuf) CHECK(!names_dmabuf(fd));
    return dmabuf;
}

}  // namespace

TEST(gpu_rdma_registration_modes_with_real_dmabuf) {
    if (!gpu_lane("gpu_rdma_registration_modes_with_real_dmabuf")) return;
    svtest::configure("sv0:roce,sv1:roce");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    DeviceBuf d(8u << 20);
    bool peermem = mcrs::rdma::peermem_module_loaded();
    bool dmabuf_ok = mcrs::gpu::dmabuf_supported(0);
    std::fprintf(stderr, "    this host: nvidia_peermem %s, DMA-BUF %s\n", peermem ? "loaded" : "not loaded",
                 dmabuf_ok ? "supported" : "not supported");

    // Plain ibv_reg_mr of the GPU address (a real NIC needs nvidia-peermem;
    // the stand-in accepts it).
    CHECK(!register_and_check(d, GpuRegistrationMode::PeerMem));
    // Auto decides from this host's facts.
    auto choice = mcrs::rdma::resolve_registration(GpuRegistrationMode::Auto, peermem, dmabuf_ok);
    if (dmabuf_ok) {
        CHECK(register_and_check(d, GpuRegistrationMode::DmaBuf));
        CHECK_EQ(register_and_check(d, GpuRegistrationMode::Auto), choice.mode == GpuRegistrationMode::DmaBuf);
        // WITH_NVIDIA_PEERMEM=0 (the engine default reads it) selects DMA-BUF.
        EnvGuard env("WITH_NVIDIA_PEERMEM", "0");
        CHECK(register_and_check(d, GpuRegistrationMode::FromEnv));
    } else {
        std::fprintf(stderr, "    DMA-BUF rows skipped: this GPU/driver does not export DMA-BUF\n");
    }
    {
        EnvGuard env("WITH_NVIDIA_PEERMEM", "1");
        CHECK(!register_and_check(d, GpuRegistrationMode::FromEnv));
    }
}
