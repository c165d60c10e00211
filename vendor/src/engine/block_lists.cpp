// Block-list submissions: a KV transfer names the same block ids for every
// layer, so it is checked, pinned and routed per region and per id instead
// of per piece. One task of the batch covers every piece. Where the peer's
// GPU memory is mapped here (CUDA IPC), the copy is one kernel launch whose
// table is per region and per id; every other route gets the pieces as
// ordinary transfer items, in region order.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/range.h"
#include "common/text.h"
#include "engine/transfer_engine.h"
#include "transport/ipc/ipc_transport.h"
#include "transport/transport.h"

namespace mcrs {

namespace {

// The lowest and highest id of a list.
struct IdSpan {
    uint64_t lo = UINT64_MAX, hi = 0;
};

IdSpan span_of(const uint64_t *ids, size_t n) {
    IdSpan s;
    for (size_t i = 0; i < n; ++i) {
        s.lo = std::min(s.lo, ids[i]);
        s.hi = std::max(s.hi, ids[i]);
    }
    return s;
}

// Where the blocks `ids` of a region lie on one side: [lo, lo + size), or
// false when an address wraps around.
bool blocks_span(uint64_t base, uint64_t stride, IdSpan ids, uint64_t len, uint64_t &lo, uint64_t &size) {
    uint64_t a = 0, b = 0, end = 0;
    if (__builtin_mul_overflow(ids.lo, stride, &a) || __builtin_add_overflow(base, a, &lo)) return false;
    if (__builtin_mul_overflow(ids.hi, stride, &b) || __builtin_add_overflow(base, b, &end) ||
        __builtin_add_overflow(end, len, &end))
        return false;
    size = end - lo;
    return true;
}

// The first id that appears twice, if any. Sorting a copy costs O(n log n)
// per list, not per piece.
bool first_repeat(const uint64_t *ids, size_t n, uint64_t &repeated) {
    thread_local std::vector<uint64_t> sorted;
    sorted.assign(ids, ids + n);
    std::sort(sorted.begin(), sorted.end());
    auto it = std::adjacent_find(sorted.begin(), sorted.end());
    if (it == sorted.end()) return false;
    repeated = *it;
    return true;
}

StatusError invalid(const std::string &why) { return StatusError(kStatusInvalidArgument, "block list: " + why); }

}  // namespace

size_t TransferEngine::submit_blocks(uint64_t batch_id, const BlockList &in) {
    auto batch = batch_or_throw(batch_id);
    if (in.opcode != kOpRead && in.opcode != kOpWrite)
        throw invalid("opcode " + std::to_string(in.opcode) + " is neither READ nor WRITE");
    if (in.num_regions == 0 || in.num_regions > kMaxBlockRegions)
        throw invalid(std::to_string(in.num_regions) + " regions; 1 to " + std::to_string(kMaxBlockRegions) +
                      " are allowed");
    if (in.num_blocks == 0 || in.num_blocks > kMaxBlockPieces / in.num_regions)
        throw invalid(std::to_string(in.num_regions) + " regions x " + std::to_string(in.num_blocks) +
                      " block ids; 1 to " + std::to_string(kMaxBlockPieces) + " pieces are allowed");
    if (!in.regions || !in.local_ids || !in.remote_ids) throw invalid("the region or id array is null");
    check_room(batch_id, 1);
    // The engine's own copy of the caller's arrays: what is checked below
    // is what runs, whatever the caller's memory does meanwhile.
    const std::vector<BlockRegion> regions(in.regions, in.regions + in.num_regions);
    const std::vector<uint64_t> local_ids(in.local_ids, in.local_ids + in.num_blocks);
    const std::vector<uint64_t> remote_ids(in.remote_ids, in.remote_ids + in.num_blocks);
    BlockList l = in;
    l.regions = regions.data();
    l.local_ids = local_ids.data();
    l.remote_ids = remote_ids.data();
    const bool write = l.opcode == kOpWrite;
    const uint64_t *dst_ids = write ? l.remote_ids : l.local_ids;
    uint64_t repeated = 0;
    if (first_repeat(dst_ids, l.num_blocks, repeated))
        throw invalid(std::string(write ? "remote" : "local") + " block id " + std::to_string(repeated) +
                      " appears twice: two pieces would write the same destination");
    const IdSpan lid = span_of(l.local_ids, l.num_blocks), rid = span_of(l.remote_ids, l.num_blocks);

    // Per region: the blocks' span on each side, and the local span pinned
    // (one range check covers every block of the region).
    std::vector<RegionPin> pins(l.num_regions);
    std::vector<uint64_t> remote_lo(l.num_regions), remote_size(l.num_regions);
    uint64_t bytes = 0;
    for (size_t r = 0; r < l.num_regions; ++r) {
        const BlockRegion &g = l.regions[r];
        auto where = [r] { return "region " + std::to_string(r) + ": "; };
        if (g.block_len == 0) throw invalid(where() + "block length is zero");
        const uint64_t dst_stride = write ? g.remote_stride : g.local_stride;
        if (l.num_blocks > 1 && dst_stride < g.block_len)
            throw invalid(where() + "the " + (write ? "remote" : "local") + " stride " + std::to_string(dst_stride) +
                          " is shorter than the block length " + std::to_string(g.block_len) +
                          ": destination blocks would overlap");
        uint64_t lo = 0, size = 0;
        if (!blocks_span(g.local_base, g.local_stride, lid, g.block_len, lo, size))
            throw invalid(where() + "local blocks wrap around the address space");
        if (!blocks_span(g.remote_base, g.remote_stride, rid, g.block_len, remote_lo[r], remote_size[r]))
            throw invalid(where() + "remote blocks wrap around the address space");
        const RegionPin *prev = r > 0 ? &pins[r - 1] : nullptr;
        pins[r] = prev && *prev && range_within(lo, size, prev->region()->addr, prev->region()->length)
                      ? prev->share()
                      : registry_.pin(lo, size, /*need_remote=*/false);
        if (!pins[r])
            throw StatusError(kStatusAddressNotRegistered, "block list: " + where() + "local blocks span [" + hex(lo) +
                                                               ", " + hex(lo + size) +
                                                               "), which is not inside one registered buffer");
        uint64_t region_bytes = 0;
        if (__builtin_mul_overflow(g.block_len, l.num_blocks, &region_bytes) ||
            __builtin_add_overflow(bytes, region_bytes, &bytes))
            throw invalid(where() + "the list's byte count overflows 64 bits");
    }
    std::vector<Target> targets;
    if (l.target_id != kLocalSegment) targets.push_back(make_target(l.target_id, "block list: "));

    auto first = batch->reserve(1);
    if (!first)  // filled by another thread since the check above
        throw StatusError(kStatusTooManyRequests, "batch " + std::to_string(batch_id) + " is full");
    const size_t task = *first;
    tasks_submitted_.fetch_add(1, std::memory_order_relaxed);

    // From here on the task exists: whatever goes wrong before its pieces
    // are handed out (memory for them, the IPC path's tables) fails it with
    // the reason, so that no caller waits for it forever.
    std::vector<TransferItem> items;
    try {
        if (!targets.empty() && targets[0].routes.cuda_ipc &&
            try_ipc_blocks(l, targets[0], pins, remote_lo, remote_size, rid.lo, *batch, task, bytes))
            return task;
        // Every other route: the pieces as transfer items, region by region.
        items.resize(l.num_regions * l.num_blocks);
    } catch (const std::exception &e) {
        batch->fail(task, std::string("block list: ") + e.what());
        return task;
    }
    batch->set_parts(task, items.size());
    size_t k = 0;
    for (size_t r = 0; r < l.num_regions; ++r) {
        const BlockRegion &g = l.regions[r];
        for (size_t i = 0; i < l.num_blocks; ++i, ++k) {
            TransferItem &it = items[k];
            it.batch = batch;
            it.task = task;
            it.opcode = l.opcode;
            it.local = reinterpret_cast<char *>(g.local_base + l.local_ids[i] * g.local_stride);
            it.remote_addr = g.remote_base + l.remote_ids[i] * g.remote_stride;
            it.length = g.block_len;
            it.local_pin = pins[r].share();
        }
    }
    pins.clear();
    dispatch(l.target_id, items, targets);  // as submit() hands out requests
    return task;
}

bool TransferEngine::try_ipc_blocks(const BlockList &l, const Target &t, const std::vector<RegionPin> &pins,
                                    const std::vector<uint64_t> &remote_lo, const std::vector<uint64_t> &remote_size,
                                    uint64_t remote_id_lo, Batch &batch, size_t task, uint64_t bytes) {
    // Every region's remote span inside one published GPU buffer whose
    // mapping has not failed; else the pieces go the per-request way.
    const SegmentDesc &d = *t.desc;
    std::vector<const BufferDesc *> buffers(l.num_regions, nullptr);
    const BufferDesc *last = nullptr;
    for (size_t r = 0; r < l.num_regions; ++r) {
        if (!last || !range_within(remote_lo[r], remote_size[r], last->addr, last->length)) {
            last = nullptr;
            for (const auto &c : d.buffers)
                if (!c.cuda_ipc.empty() && range_within(remote_lo[r], remote_size[r], c.addr, c.length)) {
                    last = &c;
                    break;
                }
            if (!last || !ipc_->usable(last->cuda_ipc)) return false;
        }
        buffers[r] = last;
    }
    IpcTransport::BlockJob job{l, buffers, remote_lo, remote_size, remote_id_lo, {}, batch, task, bytes};
    job.local_devices.reserve(l.num_regions);
    for (const auto &p : pins) job.local_devices.push_back(p.region()->device);
    return ipc_->submit_blocks(job);
}

}  // namespace mcrs
