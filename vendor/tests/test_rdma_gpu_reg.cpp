#include <cerrno>
#include <cstdlib>

#include "rdma_tmp_dir.h"
#include "test_util.h"
#include "transport/rdma/gpu_reg_mode.h"

using namespace mcrs::rdma;
using mcrs::GpuRegistrationMode;

TEST(rdma_with_nvidia_peermem_parsing) {
    using O = std::optional<std::string>;
    struct {
        O raw;
        bool value, recognized;
    } cases[] = {
        {std::nullopt, true, true}, {O("1"), true, true},        {O("0"), false, true},
        {O("true"), true, true},    {O("FALSE"), false, true},   {O(" yes "), true, true},
        {O("No"), false, true},     {O("on"), true, true},       {O("OFF\n"), false, true},
        {O("Enable"), true, true},  {O("disable"), false, true}, {O("maybe"), true, false},
        {O(""), true, false},       {O("2"), true, false},       {O("0x0"), true, false},
    };
    for (const auto &c : cases) {
        PeermemSetting s = parse_with_nvidia_peermem(c.raw);
        if (s.value != c.value || s.recognized != c.recognized)
            mctest::record_failure(__FILE__, __LINE__, "WITH_NVIDIA_PEERMEM=" + c.raw.value_or("(unset)"));
        CHECK_EQ(s.warning.empty(), c.recognized);
    }
    PeermemSetting bad = parse_with_nvidia_peermem(O("maybe"));
    CHECK(bad.warning.find("keeping the default 1") != std::string::npos);
    // Same answer as the engine config's FromEnv resolution.
    setenv("WITH_NVIDIA_PEERMEM", " off ", 1);
    CHECK(!with_nvidia_peermem_from_env().value);
    CHECK(mcrs::resolve_gpu_registration_mode(GpuRegistrationMode::FromEnv) == GpuRegistrationMode::DmaBuf);
    CHECK(resolve_registration(GpuRegistrationMode::FromEnv, true, true).mode == GpuRegistrationMode::DmaBuf);
    setenv("WITH_NVIDIA_PEERMEM", "bogus", 1);
    CHECK(with_nvidia_peermem_from_env().value);
    CHECK(resolve_registration(GpuRegistrationMode::FromEnv, false, true).mode == GpuRegistrationMode::PeerMem);
    unsetenv("WITH_NVIDIA_PEERMEM");
}

TEST(rdma_peermem_module_probe) {
    mctest::TmpDir d;
    d.mkdirs("sys/module/nvidia");
    d.write("modules_without", "nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n");
    d.write("modules_with", "nvidia_uvm 1 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n");
    d.write("modules_legacy", "nv_peer_mem 1 0 - Live 0x0");
    d.write("modules_tricky", "xnvidia_peermem 1 0 - Live\nfoo 1 0 nvidia_peermem, Live\n");
    CHECK(!peermem_module_loaded(d.at("sys/module"), d.at("modules_without")));
    CHECK(peermem_module_loaded(d.at("sys/module"), d.at("modules_with")));
    CHECK(peermem_module_loaded(d.at("sys/module"), d.at("modules_legacy")));
    CHECK(!peermem_module_loaded(d.at("sys/module"), d.at("modules_tricky")));
    CHECK(!peermem_module_loaded(d.at("nothing"), d.at("nothing")));
    d.mkdirs("sys/module/nvidia_peermem");
    CHECK(peermem_module_loaded(d.at("sys/module"), d.at("nothing")));
    d.write("sys2/module/nvidia_peermem", "not a dir");
    CHECK(!peermem_module_loaded(d.at("sys2/module"), d.at("nothing")));
}

TEST(rdma_registration_decision_table) {
    using M = GpuRegistrationMode;
    struct {
        M configured;
        bool peermem, dmabuf;
        M want;
    } cases[] = {
        {M::PeerMem, false, true, M::PeerMem}, {M::PeerMem, false, false, M::PeerMem},
        {M::DmaBuf, true, false, M::DmaBuf},   {M::DmaBuf, true, true, M::DmaBuf},
        {M::Auto, true, true, M::PeerMem},     {M::Auto, true, false, M::PeerMem},
        {M::Auto, false, true, M::DmaBuf},     {M::Auto, false, false, M::PeerMem},
    };
    for (const auto &c : cases) {
        RegistrationChoice r = resolve_registration(c.configured, c.peermem, c.dmabuf);
        if (r.mode != c.want || r.reason.empty())
            mctest::record_failure(__FILE__, __LINE__,
                                   "mode " + std::to_string(int(c.configured)) + " peermem=" +
                                       std::to_string(c.peermem) + " dmabuf=" + std::to_string(c.dmabuf));
    }
    CHECK(resolve_registration(M::Auto, false, false).reason.find("neither") != std::string::npos);
}

TEST(rdma_registration_failure_messages) {
    std::string m = registration_failure_message(RegPath::PeerMemRegMr, EFAULT, 0x7f0000001000, 1 << 20, "mlx5_0");
    for (const char *needle : {"Failed to register memory 0x7f0000001000 (1048576 bytes) on mlx5_0",
                               "ibv_reg_mr", "Bad address [14]", "modprobe nvidia-peermem",
                               "WITH_NVIDIA_PEERMEM=0", "GpuRegistrationMode::DmaBuf",
                               "GpuRegistrationMode::Auto"})
        if (m.find(needle) == std::string::npos)
            mctest::record_failure(__FILE__, __LINE__, std::string("missing '") + needle + "' in: " + m);
    std::string d = registration_failure_message(RegPath::DmaBufRegMr, EOPNOTSUPP, 0x1000, 4096, "mlx5_1");
    CHECK(d.find("ibv_reg_dmabuf_mr") != std::string::npos);
    CHECK(d.find("DMA-BUF") != std::string::npos);
    CHECK(d.find("[" + std::to_string(EOPNOTSUPP) + "]") != std::string::npos);
    CHECK(d.find("modprobe") == std::string::npos);
    std::string n = registration_failure_message(RegPath::HostRegMr, ENOMEM, 0x1000, 4096, "mlx5_0");
    CHECK(n.find("ulimit -l") != std::string::npos);
    CHECK(n.find("host memory") != std::string::npos);
    // EFAULT on the DMA-BUF path is not a peermem problem.
    std::string df = registration_failure_message(RegPath::DmaBufRegMr, EFAULT, 0x1000, 4096, "mlx5_0");
    CHECK(df.find("modprobe") == std::string::npos);
    CHECK(df.find("Bad address [14]") != std::string::npos);
}
