// The CUDA IPC descriptor keys a peer publishes (mc_cuda_ipc, and
// mc_cuda_ipc_offset), checked without a GPU: the handle codec in CUDA
// builds, where a malformed handle must be refused before it reaches
// cudaIpcOpenMemHandle, the offset bound in every build, and the IPC
// transport's hand-off of requests it cannot map.
#include <atomic>
#include <cstdint>
#include <memory>
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

// Requests for an allocation that cannot be mapped (here a malformed
// handle, refused in every build) go to the IPC workers and come back
// through the fallback. The workers are woken only when work is queued, so
// every round must still reach them; after stop() a submission is refused
// by name, not left waiting.
TEST(ipc_transport_hands_unmappable_requests_to_the_fallback) {
    constexpr size_t kItems = 64, kBlock = 4096;
    mcrs::IpcTransport ipc(2);
    auto desc = std::make_shared<mcrs::SegmentDesc>();
    mcrs::BufferDesc b;
    b.addr = 0x7f0000000000;
    b.length = kItems * kBlock;
    b.cuda_ipc = "not-a-cuda-ipc-handle";
    b.cuda_device = 0;
    desc->buffers.push_back(b);
    std::vector<char> host(kItems * kBlock);
    std::atomic<size_t> fell_back{0};
    auto round = [&](std::string &first_error) {
        auto batch = std::make_shared<mcrs::Batch>(1, kItems);
        auto first = batch->reserve(kItems);
        REQUIRE(first.has_value());
        std::vector<mcrs::TransferItem> items(kItems);
        for (size_t i = 0; i < kItems; ++i) {
            items[i].batch = batch;
            items[i].task = *first + i;
            items[i].opcode = static_cast<int>(i % 2);
            items[i].local = host.data() + i * kBlock;
            items[i].remote_addr = b.addr + i * kBlock;
            items[i].length = kBlock;
        }
        std::vector<const mcrs::BufferDesc *> buffers(kItems, &desc->buffers[0]);
        ipc.submit(desc, items, buffers, [&](std::vector<mcrs::TransferItem> &back) {
            fell_back += back.size();
            for (auto &it : back) it.fail("fell back");
        });
        if (!batch->wait(30000)) return false;
        first_error = batch->task(0).error;
        for (size_t i = 0; i < kItems; ++i)
            if (batch->observe(i, nullptr) != STATUS_FAILED) return false;
        return true;
    };
    std::string why;
    for (size_t r = 1; r <= 8; ++r) {
        REQUIRE(round(why));
        CHECK_EQ(why, std::string("fell back"));
        CHECK_EQ(fell_back.load(), r * kItems);
    }
    CHECK_EQ(ipc.copies(), 0u);
    ipc.stop();
    REQUIRE(round(why));
    CHECK(why.find("shutting down") != std::string::npos);
    CHECK_EQ(fell_back.load(), 8 * kItems);
}
