// Shared helpers of the softverbs tests (test_softverbs.cpp,
// test_softverbs_data.cpp): a one-line sysfs reader, a seeded buffer filler,
// two connected QPs with a buffer and MR on each side (Pair) and a
// completion check (expect_wc).
#pragma once

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "softverbs_fixture.h"

namespace svpair {

using namespace svtest;

inline std::string read_text(const std::string &path) {
    std::ifstream in(path);
    std::string s;
    std::getline(in, s);
    return s;
}

inline void fill(std::vector<unsigned char> &v, unsigned seed) {
    std::mt19937 rng(seed);
    for (auto &b : v) b = static_cast<unsigned char>(rng());
}

// Two connected QPs on two devices, with one buffer and MR on each side.
struct Pair {
    Dev a, b;
    Qp qa, qb;
    std::vector<unsigned char> ba, bb;
    Mr ma, mb;
    Pair(const char *da, const char *db, size_t len, int access_b = kAllAccess)
        : a(da), b(db), qa(a), qb(b), ba(len), bb(len), ma(a, ba.data(), len, kAllAccess),
          mb(b, bb.data(), len, access_b) {
        REQUIRE(ma.mr && mb.mr);
        connect(a, qa, b, qb);
    }
    int write(size_t off, uint32_t len, uint64_t id, uint32_t rkey_delta = 0, uint64_t remote_off = ~0ull) {
        uint64_t r = addr(bb.data()) + (remote_off == ~0ull ? off : remote_off);
        return post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, ba.data() + off, len, ma.mr->lkey, r,
                         mb.mr->rkey + rkey_delta, id);
    }
    int read(size_t off, uint32_t len, uint64_t id) {
        return post_rdma(qa.qp, ibv::IBV_WR_RDMA_READ, ba.data() + off, len, ma.mr->lkey, addr(bb.data()) + off,
                         mb.mr->rkey, id);
    }
};

inline ibv::wc expect_wc(ibv::cq *cq, uint64_t id, int status) {
    ibv::wc wc{};
    bool got = wait_wc(cq, wc);
    CHECK(got);
    if (got) {
        CHECK_EQ(wc.wr_id, id);
        CHECK_EQ(std::string(ibv::wc_status_name(wc.status)), std::string(ibv::wc_status_name(status)));
    }
    return wc;
}

}  // namespace svpair
