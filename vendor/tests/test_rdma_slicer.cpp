#include <map>
#include <random>

#include "common/error.h"
#include "core/config.h"
#include "test_util.h"
#include "transport/rdma/slicer.h"

using namespace mcrs::rdma;
using mcrs::Error;

namespace {

std::vector<uint64_t> lengths(const std::vector<Slice> &v) {
    std::vector<uint64_t> out;
    for (const Slice &s : v) out.push_back(s.length);
    return out;
}

bool throws_code(const std::function<void()> &fn, int code) {
    try {
        fn();
    } catch (const Error &e) {
        return e.code() == code;
    }
    return false;
}

const uint64_t kL = 0x10000000, kR = 0x7f0000000000;

}  // namespace

TEST(rdma_slicer_tail_merge) {
    SliceParams p;  // 65536 + 16384
    std::vector<MrChunk> l = {{kL, 1 << 24}}, r = {{kR, 1 << 24}};
    struct {
        uint64_t len;
        std::vector<uint64_t> want;
    } cases[] = {
        {1, {1}},
        {65536, {65536}},
        {81920, {81920}},                       // remainder <= slice + limit: whole
        {81921, {65536, 16385}},
        {131072, {65536, 65536}},
        {200000, {65536, 65536, 68928}},
        {65536 * 3 + 16384, {65536, 65536, 81920}},
    };
    for (const auto &c : cases) {
        auto got = lengths(cut_slices(kL, kR, c.len, l, r, p));
        if (got != c.want)
            mctest::record_failure(__FILE__, __LINE__, "length " + std::to_string(c.len) + " cut wrongly");
    }
    CHECK(cut_slices(kL, kR, 0, l, r, p).empty());
    // MC_FRAGMENT_RATIO: limit = slice / ratio.
    CHECK_EQ(fragment_limit_for(65536, 0), uint64_t(16384));
    CHECK_EQ(fragment_limit_for(65536, 8), uint64_t(8192));
    SliceParams p8{65536, fragment_limit_for(65536, 8)};
    CHECK((lengths(cut_slices(kL, kR, 65536 + 8193, l, r, p8)) == std::vector<uint64_t>{65536, 8193}));
    CHECK((lengths(cut_slices(kL, kR, 65536 + 8192, l, r, p8)) == std::vector<uint64_t>{73728}));
}

TEST(rdma_slicer_respects_mr_boundaries) {
    SliceParams p;
    // Local: two adjacent MRs of 100000 bytes (listed out of order); remote: one MR.
    std::vector<MrChunk> l = {{kL + 100000, 100000}, {kL, 100000}};
    std::vector<MrChunk> r = {{kR, 1 << 20}};
    auto s = cut_slices(kL, kR, 150000, l, r, p);
    CHECK((lengths(s) == std::vector<uint64_t>{65536, 34464, 50000}));
    REQUIRE_EQ(s.size(), size_t(3));
    CHECK_EQ(s[0].local_mr, size_t(1));
    CHECK_EQ(s[1].local_mr, size_t(1));
    CHECK_EQ(s[2].local_mr, size_t(0));
    CHECK_EQ(s[2].local_addr, kL + 100000);
    CHECK_EQ(s[2].remote_addr, kR + 100000);
    CHECK_EQ(s[2].offset, uint64_t(100000));
    // Remote boundary inside a slice-sized stretch: cut there too.
    std::vector<MrChunk> r2 = {{kR, 70000}, {kR + 70000, 70000}};
    auto t = cut_slices(kL, kR, 140000, {{kL, 1 << 20}}, r2, p);
    CHECK((lengths(t) == std::vector<uint64_t>{70000, 70000}));
    CHECK_EQ(t[1].remote_mr, size_t(1));
}

TEST(rdma_slicer_property_random_layouts) {
    std::mt19937_64 rng(12345);
    for (int iter = 0; iter < 300; ++iter) {
        auto make = [&](uint64_t base) {
            std::vector<MrChunk> v;
            uint64_t a = base;
            for (int i = 0; i < 6; ++i) {
                uint64_t len = 1 + rng() % 300000;
                v.push_back({a, len});
                a += len;
            }
            std::shuffle(v.begin(), v.end(), rng);
            return v;
        };
        std::vector<MrChunk> l = make(kL), r = make(kR);
        uint64_t slice = 1 + rng() % 100000;
        SliceParams p{slice, fragment_limit_for(slice, 1 + rng() % 8)};
        uint64_t off = rng() % 100000, len = 1 + rng() % 500000;
        std::vector<Slice> s;
        try {
            s = cut_slices(kL + off, kR + off / 2, len, l, r, p);
        } catch (const Error &e) {
            // Only when the request runs past the registered ranges.
            CHECK_EQ(e.code(), int(mcrs::kErrAddressNotRegistered));
            continue;
        }
        uint64_t pos = 0;
        for (const Slice &x : s) {
            CHECK_EQ(x.offset, pos);
            CHECK(x.length > 0 && x.length <= p.slice_size + p.fragment_limit);
            const MrChunk &lm = l[x.local_mr], &rm = r[x.remote_mr];
            CHECK(x.local_addr >= lm.addr && x.local_addr + x.length <= lm.addr + lm.length);
            CHECK(x.remote_addr >= rm.addr && x.remote_addr + x.length <= rm.addr + rm.length);
            pos += x.length;
        }
        CHECK_EQ(pos, len);
    }
}

TEST(rdma_slicer_bad_input) {
    SliceParams p;
    std::vector<MrChunk> l = {{kL, 1000}}, r = {{kR, 1000}};
    CHECK(throws_code([&] { cut_slices(kL, kR, 1001, l, r, p); }, mcrs::kErrAddressNotRegistered));
    CHECK(throws_code([&] { cut_slices(kL - 1, kR, 10, l, r, p); }, mcrs::kErrAddressNotRegistered));
    CHECK(throws_code([&] { cut_slices(kL, kR, 10, {}, r, p); }, mcrs::kErrAddressNotRegistered));
    CHECK(throws_code([&] { cut_slices(kL, kR, 10, {{kL, 100}, {kL + 50, 100}}, r, p); },
                      mcrs::kErrInvalidArgument));
    CHECK(throws_code([&] { cut_slices(kL, kR, 10, {{kL, 0}}, r, p); }, mcrs::kErrInvalidArgument));
    CHECK(throws_code([&] { cut_slices(kL, kR, 10, {{UINT64_MAX - 5, 100}}, r, p); },
                      mcrs::kErrInvalidArgument));
    CHECK(throws_code([&] { cut_slices(UINT64_MAX - 5, kR, 10, l, r, p); }, mcrs::kErrInvalidArgument));
    CHECK(throws_code([&] { cut_slices(kL, kR, 10, l, r, SliceParams{0, 0}); }, mcrs::kErrInvalidArgument));
    CHECK(throws_code([&] { cut_slices(kL, kR, 10, l, r, SliceParams{10, 11}); }, mcrs::kErrInvalidArgument));
    // A gap between two local MRs.
    CHECK(throws_code([&] { cut_slices(kL, kR, 900, {{kL, 100}, {kL + 200, 800}}, r, p); },
                      mcrs::kErrAddressNotRegistered));
    // The top of the address space is fine when nothing wraps.
    auto top = cut_slices(UINT64_MAX - 100, kR, 100, {{UINT64_MAX - 100, 100}}, r, p);
    CHECK_EQ(top.size(), size_t(1));
}

TEST(rdma_slicer_assign_weighted) {
    std::vector<NicShare> nics = {{3, 2}, {5, 1}, {7, 0}};
    auto routes = assign_slices(6, nics, StripeMode::WeightedRoundRobin, 2,
                                [](int local, size_t i) { return local * 100 + static_cast<int>(i); });
    int want[] = {3, 5, 3, 3, 5, 3};
    REQUIRE_EQ(routes.size(), size_t(6));
    for (size_t i = 0; i < 6; ++i) {
        CHECK_EQ(routes[i].local_nic, want[i]);
        CHECK_EQ(routes[i].peer_nic, want[i] * 100 + static_cast<int>(i));
        CHECK_EQ(routes[i].retry_count, 2);
    }
    // Long run: shares follow the weights exactly per period.
    auto many = assign_slices(3000, {{0, 3}, {1, 2}, {2, 1}}, StripeMode::WeightedRoundRobin);
    std::map<int, int> count;
    for (const auto &r : many) {
        ++count[r.local_nic];
        CHECK_EQ(r.peer_nic, -1);
    }
    CHECK_EQ(count[0], 1500);
    CHECK_EQ(count[1], 1000);
    CHECK_EQ(count[2], 500);
}

TEST(rdma_slicer_assign_equal_share) {
    auto routes = assign_slices(7, {{1, 1}, {2, 5}, {4, 1}}, StripeMode::EqualShare);
    int want[] = {1, 1, 1, 2, 2, 4, 4};
    for (size_t i = 0; i < 7; ++i) CHECK_EQ(routes[i].local_nic, want[i]);
    auto few = assign_slices(2, {{1, 1}, {2, 1}, {4, 1}}, StripeMode::EqualShare);
    CHECK_EQ(few[0].local_nic, 1);
    CHECK_EQ(few[1].local_nic, 2);
    CHECK(assign_slices(0, {}, StripeMode::EqualShare).empty());
    CHECK(throws_code([] { assign_slices(3, {{1, 0}}, StripeMode::WeightedRoundRobin); },
                      mcrs::kErrDeviceNotFound));
    CHECK(throws_code([] { assign_slices(3, {}, StripeMode::EqualShare); }, mcrs::kErrDeviceNotFound));
    CHECK_EQ(assign_slices(1, {{9, 1}}, StripeMode::EqualShare, -3)[0].retry_count, 0);
}
