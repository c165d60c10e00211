#include "transport/rdma/slicer.h"

#include <algorithm>

#include "common/error.h"

namespace mcrs::rdma {

namespace {

struct Indexed {
    uint64_t addr, end;
    size_t index;
};

std::vector<Indexed> sorted_chunks(const std::vector<MrChunk> &mrs, const char *side) {
    std::vector<Indexed> v;
    v.reserve(mrs.size());
    for (size_t i = 0; i < mrs.size(); ++i) {
        const MrChunk &m = mrs[i];
        if (m.length == 0 || m.addr + m.length < m.addr)
            throw Error(kErrInvalidArgument, std::string(side) + " MR chunk " + std::to_string(i) +
                                                 " is empty or wraps the address space");
        v.push_back({m.addr, m.addr + m.length, i});
    }
    std::sort(v.begin(), v.end(), [](const Indexed &a, const Indexed &b) { return a.addr < b.addr; });
    for (size_t i = 1; i < v.size(); ++i)
        if (v[i].addr < v[i - 1].end)
            throw Error(kErrInvalidArgument, std::string(side) + " MR chunks " +
                                                 std::to_string(v[i - 1].index) + " and " +
                                                 std::to_string(v[i].index) + " overlap");
    return v;
}

// The chunk holding `addr`, or nullptr.
const Indexed *find_chunk(const std::vector<Indexed> &v, uint64_t addr) {
    auto it = std::upper_bound(v.begin(), v.end(), addr,
                               [](uint64_t a, const Indexed &c) { return a < c.addr; });
    if (it == v.begin()) return nullptr;
    --it;
    return addr < it->end ? &*it : nullptr;
}

}  // namespace

std::vector<Slice> cut_slices(uint64_t local_addr, uint64_t remote_addr, uint64_t length,
                              const std::vector<MrChunk> &local_mrs,
                              const std::vector<MrChunk> &remote_mrs, const SliceParams &p) {
    if (p.slice_size == 0) throw Error(kErrInvalidArgument, "slice size must be > 0");
    if (p.fragment_limit > p.slice_size)
        throw Error(kErrInvalidArgument, "fragment limit must not exceed the slice size");
    std::vector<Slice> out;
    if (length == 0) return out;
    if (local_addr + length < local_addr || remote_addr + length < remote_addr)
        throw Error(kErrInvalidArgument, "request wraps the address space");
    std::vector<Indexed> lc = sorted_chunks(local_mrs, "local");
    std::vector<Indexed> rc = sorted_chunks(remote_mrs, "remote");
    uint64_t pos = 0;
    while (pos < length) {
        const Indexed *l = find_chunk(lc, local_addr + pos);
        if (!l)
            throw Error(kErrAddressNotRegistered,
                        "local range at offset " + std::to_string(pos) + " is not registered");
        const Indexed *r = find_chunk(rc, remote_addr + pos);
        if (!r)
            throw Error(kErrAddressNotRegistered,
                        "remote range at offset " + std::to_string(pos) + " is not registered");
        uint64_t piece = std::min({length - pos, l->end - (local_addr + pos),
                                   r->end - (remote_addr + pos)});
        uint64_t done = 0;
        while (done < piece) {
            uint64_t rest = piece - done;
            uint64_t n = rest <= p.slice_size + p.fragment_limit ? rest : p.slice_size;
            Slice s;
            s.offset = pos + done;
            s.length = n;
            s.local_addr = local_addr + s.offset;
            s.remote_addr = remote_addr + s.offset;
            s.local_mr = l->index;
            s.remote_mr = r->index;
            out.push_back(s);
            done += n;
        }
        pos += piece;
    }
    return out;
}

std::vector<SliceRoute> assign_slices(size_t slice_count, const std::vector<NicShare> &nics,
                                      StripeMode mode, int advise_retry_cnt,
                                      const std::function<int(int, size_t)> &peer_for) {
    std::vector<SliceRoute> out;
    if (slice_count == 0) return out;
    std::vector<NicShare> used;
    for (const NicShare &n : nics)
        if (n.weight > 0) used.push_back(n);
    if (used.empty()) throw Error(kErrDeviceNotFound, "no local RDMA device is eligible for the request");
    out.resize(slice_count);
    if (mode == StripeMode::EqualShare) {
        size_t k = used.size(), base = slice_count / k, extra = slice_count % k, i = 0;
        for (size_t n = 0; n < k; ++n) {
            size_t run = base + (n < extra ? 1 : 0);
            for (size_t j = 0; j < run; ++j) out[i++].local_nic = used[n].local_nic;
        }
    } else {
        // Smooth weighted round-robin: every step each NIC gains its weight,
        // the richest is chosen and pays the total.
        int64_t total = 0;
        for (const NicShare &n : used) total += n.weight;
        std::vector<int64_t> current(used.size(), 0);
        for (size_t i = 0; i < slice_count; ++i) {
            size_t best = 0;
            for (size_t n = 0; n < used.size(); ++n) {
                current[n] += used[n].weight;
                if (current[n] > current[best]) best = n;
            }
            current[best] -= total;
            out[i].local_nic = used[best].local_nic;
        }
    }
    for (size_t i = 0; i < slice_count; ++i) {
        out[i].retry_count = advise_retry_cnt < 0 ? 0 : advise_retry_cnt;
        if (peer_for) out[i].peer_nic = peer_for(out[i].local_nic, i);
    }
    return out;
}

}  // namespace mcrs::rdma
