// A transfer request as the engine sees it. The C API translates the public
// `transfer_request` into this one (same fields and values), so nothing
// below the C API needs the public header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mcrs {

constexpr int kOpRead = 0;            // remote -> local
constexpr int kOpWrite = 1;           // local -> remote
constexpr int32_t kLocalSegment = 0;  // the engine's own memory

struct Request {
    int opcode = kOpRead;
    void *source = nullptr;  // local address
    int32_t target_id = 0;   // segment id from open_segment, or kLocalSegment
    uint64_t target_offset = 0;  // address in the target segment
    uint64_t length = 0;
};

}  // namespace mcrs

namespace mcrs {

// A block-list transfer (TransferEngine::submit_blocks): for every region r
// and every i < num_blocks, the block of region r with id local_ids[i] here
// and the one with id remote_ids[i] in the target segment. A KV pull names
// the same block ids for every layer, so this is per region and per id,
// where requests would be per region x id.
struct BlockRegion {
    uint64_t local_base = 0;   // address of block 0 here
    uint64_t remote_base = 0;  // address of block 0 in the target segment
    uint64_t local_stride = 0;
    uint64_t remote_stride = 0;
    uint64_t block_len = 0;
};

struct BlockList {
    int opcode = kOpRead;
    int32_t target_id = kLocalSegment;
    const BlockRegion *regions = nullptr;
    size_t num_regions = 0;
    const uint64_t *local_ids = nullptr;
    const uint64_t *remote_ids = nullptr;
    size_t num_blocks = 0;
};

// Bounds of one block list: the pieces (regions x ids) at most as many as a
// batch may hold tasks.
constexpr size_t kMaxBlockRegions = 1u << 16;
constexpr size_t kMaxBlockPieces = 1u << 24;

}  // namespace mcrs
