// The CUDA IPC descriptor keys a peer publishes (mc_cuda_ipc, and
// mc_cuda_ipc_offset), checked without a GPU: the handle codec in CUDA
// builds, where a malformed handle must be refused before it reaches
// cudaIpcOpenMemHandle, and the offset bound in every build.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/segment_descriptor.h"
#include "engine_fixture.h"
#include "gpu/ipc_handle.h"
#include "transport/ipc/ipc_transport.h"

// The peer names where its buffer sits inside the allocation it exports;
// only the size the driver mapped bounds it. Nothing past the mapping, and
// no sum that wraps.
TEST(ipc_offset_is_bounded_by_the_mapped_size) {
    const uint64_t kMapped = 2u << 20, kBuf = 0x7f0000000000, kLen = 1u << 20;
    auto buffer = [&](uint64_t len, uint64_t ipc_offset) {
        mcrs::BufferDesc b;
        b.addr = kBuf;
        b.length = len;
        b.cuda_ipc_offset = ipc_offset;
        return b;
    };
    mcrs::BufferDesc t = buffer(kLen, 4096);
    uint64_t off = 0;
    REQUIRE(mcrs::ipc_offset_in_mapping(t, kMapped, kBuf, kLen, off));
    CHECK_EQ(off, 4096u);
    REQUIRE(mcrs::ipc_offset_in_mapping(t, kMapped, kBuf + kLen - 8, 8, off));
    CHECK_EQ(off, 4096u + kLen - 8);
    // The buffer's last byte is the mapping's last byte: allowed.
    t.cuda_ipc_offset = kMapped - kLen;
    CHECK(mcrs::ipc_offset_in_mapping(t, kMapped, kBuf + kLen - 1, 1, off));
    CHECK_EQ(off, kMapped - 1);
    // One byte further, past the end, far past, and sums that would wrap.
    for (uint64_t bad : {kMapped - kLen + 1, kMapped, uint64_t{1} << 40, UINT64_MAX - kLen + 1, UINT64_MAX}) {
        t.cuda_ipc_offset = bad;
        CHECK(!mcrs::ipc_offset_in_mapping(t, kMapped, kBuf, 1, off));
    }
    // A buffer longer than the allocation, even at offset 0.
    CHECK(!mcrs::ipc_offset_in_mapping(buffer(kMapped + 1, 0), kMapped, kBuf, 1, off));
    CHECK(!mcrs::ipc_offset_in_mapping(buffer(UINT64_MAX, 0), kMapped, kBuf, 1, off));
    // The range itself must lie inside the advertised buffer.
    t.cuda_ipc_offset = 0;
    CHECK(!mcrs::ipc_offset_in_mapping(t, kMapped, kBuf - 1, 8, off));
    CHECK(!mcrs::ipc_offset_in_mapping(t, kMapped, kBuf + kLen - 4, 8, off));
    CHECK(!mcrs::ipc_offset_in_mapping(t, kMapped, kBuf, 0, off));
    CHECK(!mcrs::ipc_offset_in_mapping(t, kMapped, UINT64_MAX, 2, off));
    // Nothing is mapped: nothing is in range.
    CHECK(!mcrs::ipc_offset_in_mapping(t, 0, kBuf, 1, off));
}

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

// Routing trusts the last buffer a run of requests hit only where no two
// buffers with a handle overlap; a peer that publishes overlapping ones gets
// the first-match scan for every request.
TEST(ipc_buffers_overlap_is_derived_when_decoding) {
    auto with = [](std::vector<std::pair<uint64_t, uint64_t>> ranges, bool handles) {
        mcrs::SegmentDesc d;
        d.name = "127.0.0.1:12345";
        d.protocol = "tcp";
        for (auto r : ranges) {
            mcrs::BufferDesc b;
            b.name = "cuda:0";
            b.addr = r.first;
            b.length = r.second;
            if (handles) b.cuda_ipc = std::string(128, 'a');
            b.cuda_device = 0;
            d.buffers.push_back(b);
        }
        return mcrs::decode_segment_desc(mcrs::encode_segment_desc(d));
    };
    CHECK(!with({{0x1000, 0x1000}, {0x2000, 0x1000}}, true).ipc_buffers_overlap);
    CHECK(with({{0x2000, 0x1000}, {0x1000, 0x1001}}, true).ipc_buffers_overlap);
    CHECK(with({{0x1000, 0x4000}, {0x2000, 0x10}}, true).ipc_buffers_overlap);
    CHECK(!with({{0x1000, 0x4000}, {0x2000, 0x10}}, false).ipc_buffers_overlap);
    CHECK(with({{UINT64_MAX - 0x20, 0x10}, {UINT64_MAX - 0x18, 0x8}}, true).ipc_buffers_overlap);
    CHECK(!with({{UINT64_MAX - 0x20, 0x10}, {UINT64_MAX - 0x10, 0x10}}, true).ipc_buffers_overlap);
    // Not decoded (built in code): no such promise.
    CHECK(mcrs::SegmentDesc{}.ipc_buffers_overlap);
}
