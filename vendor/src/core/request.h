// A transfer request as the engine sees it. The C API translates the public
// `transfer_request` into this one (same fields and values), so nothing
// below the C API needs the public header.
#pragma once

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
