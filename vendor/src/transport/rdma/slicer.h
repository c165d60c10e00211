// Cutting one transfer request into RDMA work requests and spreading the
// slices over the local NICs (docs/wire-protocol.md, RDMA slicing and failure
// handling).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace mcrs::rdma {

// One registered memory region (an MR chunk: a buffer above max_mr_size is
// several). Boundaries only; keys are looked up by the caller.
struct MrChunk {
    uint64_t addr = 0;
    uint64_t length = 0;
};

struct SliceParams {
    uint64_t slice_size = 65536;
    uint64_t fragment_limit = 16384;  // a remainder <= slice_size + this is kept whole
};

// fragment_limit from MC_FRAGMENT_RATIO: fragment_limit_for in core/config.h.

struct Slice {
    uint64_t offset = 0;  // from the start of the request
    uint64_t length = 0;
    uint64_t local_addr = 0;
    uint64_t remote_addr = 0;
    size_t local_mr = 0;   // index into the local chunk list
    size_t remote_mr = 0;  // index into the remote chunk list
};

// Cuts [local_addr, +length) <-> [remote_addr, +length). The request is first
// split at every local and remote MR boundary; each piece is then cut into
// slice_size slices, its last slice absorbing a remainder of up to
// fragment_limit (so slices are at most slice_size + fragment_limit long).
// No slice crosses an MR boundary on either side. Chunk lists may be in any
// order but must not overlap or wrap. Throws Error(kErrInvalidArgument) for
// bad params, overlapping chunks or a wrapping request, and
// Error(kErrAddressNotRegistered) when part of a side is not covered.
// length 0 gives no slice.
std::vector<Slice> cut_slices(uint64_t local_addr, uint64_t remote_addr, uint64_t length,
                              const std::vector<MrChunk> &local_mrs,
                              const std::vector<MrChunk> &remote_mrs, const SliceParams &params);

// How slices of one request are spread over its eligible local NICs.
enum class StripeMode {
    WeightedRoundRobin,  // interleaved, NIC i gets weight_i / sum of the slices (smooth WRR)
    EqualShare,          // contiguous runs of near-equal length, NIC order kept
};

struct NicShare {
    int local_nic = 0;    // HCA index
    uint32_t weight = 1;  // 0 = not used (WeightedRoundRobin); EqualShare ignores weights > 0
};

struct SliceRoute {
    int local_nic = -1;
    int peer_nic = -1;    // index into the peer's devices[]
    int retry_count = 0;  // starts at the request's advise_retry_cnt
};

// One route per slice. `peer_for(local_nic, slice_index)` chooses the peer
// device (e.g. PeerTopology::select); without it peer_nic stays -1. Throws
// Error(kErrDeviceNotFound) when no NIC has a non-zero weight and there are
// slices to place.
std::vector<SliceRoute> assign_slices(size_t slice_count, const std::vector<NicShare> &nics,
                                      StripeMode mode, int advise_retry_cnt = 0,
                                      const std::function<int(int, size_t)> &peer_for = {});

}  // namespace mcrs::rdma
