// GPU lane (MOONCAKE_GPU_TESTS=1): the real GPU enumeration behind the RDMA
// "cuda:<ordinal>" entries against the runtime and the host's sysfs.
#include <sys/stat.h>

#include <string>

#include "gpu/gpu.h"
#include "gpu_lane.h"
#include "test_util.h"
#include "transport/rdma/gpu_pci.h"

using namespace mcrs::rdma;

TEST(gpu_pci_enumeration_matches_runtime) {
    if (!mctest::gpu_lane("gpu_pci_enumeration_matches_runtime")) return;
    const mcrs::gpu::Status &st = mcrs::gpu::status();
    REQUIRE(st.usable);  // st.device_count is cudaGetDeviceCount's
    std::vector<GpuInfo> gpus = list_cuda_gpus();
    REQUIRE_EQ(gpus.size(), static_cast<size_t>(st.device_count));
    for (size_t i = 0; i < gpus.size(); ++i) {
        const GpuInfo &g = gpus[i];
        std::fprintf(stderr, "    GPU %d: %s numa %d %s\n", g.ordinal, g.pci_bus_id.c_str(), g.numa_node,
                     g.pci_path.c_str());
        CHECK_EQ(g.ordinal, static_cast<int>(i));
        auto canon = canonical_pci_bus_id(g.pci_bus_id);
        REQUIRE(canon.has_value());
        CHECK_EQ(*canon, g.pci_bus_id);  // already lower case, sysfs form
        for (char c : g.pci_bus_id) CHECK(!(c >= 'A' && c <= 'Z'));
        struct stat sb;
        CHECK(::stat(("/sys/bus/pci/devices/" + g.pci_bus_id).c_str(), &sb) == 0);
        CHECK(!g.pci_path.empty());
        CHECK_EQ(g.pci_path, real_path("/sys/bus/pci/devices/" + g.pci_bus_id));
        CHECK(g.numa_node >= -1);
    }
}
