// The GPU lane's gate and a device buffer, shared by the GPU test files.
// Without MOONCAKE_GPU_TESTS=1 GPU tests skip; with it, a GPU that is not
// usable is a failure (the lane must fail for real where it runs).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mooncake_ext.h"
#include "test_util.h"

namespace mctest {

inline mc_gpu_info_t gpu_info(std::string *reason = nullptr) {
    mc_gpu_info_t info{};
    char buf[512] = {0};
    mc_gpu_query(&info, buf, sizeof buf);
    if (reason) *reason = buf;
    return info;
}

// True when the GPU lane should run; prints why not otherwise.
inline bool gpu_lane(const char *test) {
    const char *want = std::getenv("MOONCAKE_GPU_TESTS");
    if (!want || std::string(want) != "1") {
        (void)test;
        mctest::record_skip("GPU lane off: set MOONCAKE_GPU_TESTS=1 on a machine with a GPU");
        return false;
    }
    std::string why;
    mc_gpu_info_t info = gpu_info(&why);
    if (!info.usable) mctest::record_failure(__FILE__, __LINE__, "MOONCAKE_GPU_TESTS=1 but: " + why);
    return info.usable != 0;
}

// True when the two-GPU lane should run: the GPU lane, and a second GPU.
// MOONCAKE_GPU2_TESTS=1 makes a missing second GPU a failure.
inline bool gpu_pair_lane(const char *test) {
    if (!gpu_lane(test)) return false;
    int n = gpu_info().device_count;
    if (n >= 2) return true;
    const char *want = std::getenv("MOONCAKE_GPU2_TESTS");
    if (want && std::string(want) == "1")
        mctest::record_failure(__FILE__, __LINE__, "MOONCAKE_GPU2_TESTS=1 but " + std::to_string(n) + " GPU(s) visible");
    else
        mctest::record_skip("needs 2 GPUs, " + std::to_string(n) + " visible");
    return false;
}

struct DeviceBuf {
    void *ptr = nullptr;
    size_t len = 0;
    int device = 0;
    DeviceBuf(size_t n, int dev = 0) : len(n), device(dev) {
        if (mc_gpu_alloc(dev, n, &ptr) != 0) {
            mctest::record_failure(__FILE__, __LINE__, std::string("mc_gpu_alloc: ") + mc_last_error_message());
            throw mctest::Abort{};
        }
    }
    ~DeviceBuf() { mc_gpu_free(device, ptr); }
    char *at(size_t off) const { return static_cast<char *>(ptr) + off; }
    void upload(const std::vector<char> &h, size_t off = 0) { REQUIRE_EQ(mc_gpu_memcpy(at(off), h.data(), h.size()), 0); }
    std::vector<char> download(size_t off, size_t n) const {
        std::vector<char> h(n);
        if (mc_gpu_memcpy(h.data(), at(off), n) != 0) mctest::record_failure(__FILE__, __LINE__, mc_last_error_message());
        return h;
    }
};

}  // namespace mctest
