// softverbs, the software RDMA stand-in, moving data: reads and writes of
// many sizes, unsignaled and inline writes, access violations, retry
// exhaustion, injected errors, fatal and port events, queue limits, the
// completion channel, concurrent posters and device close. The device,
// sysfs, MR and QP-state tests are in test_softverbs.cpp.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <random>
#include <vector>

#include "softverbs_pair.h"

using namespace svtest;
using namespace svpair;

TEST(softverbs_read_and_write_many_sizes_between_devices) {
    configure("sv0:roce,sv1:roce,sv2:ib,sv3:ib");
    const size_t kLen = (3u << 20) + 4096;
    const uint32_t sizes[] = {1, 7, 64, 4095, 4096, 65537, 1u << 20, (3u << 20) + 5};
    const char *pairs[][2] = {{"sv0", "sv1"}, {"sv2", "sv3"}, {"sv1", "sv1"}};
    unsigned seed = 1;
    for (auto &pr : pairs) {
        Pair p(pr[0], pr[1], kLen);
        uint64_t id = 100;
        for (uint32_t len : sizes) {
            size_t off = seed % 7;
            fill(p.ba, seed++);
            std::fill(p.bb.begin(), p.bb.end(), 0);
            REQUIRE_EQ(p.write(off, len, id), 0);
            ibv::wc wc = expect_wc(p.a.cq, id++, ibv::IBV_WC_SUCCESS);
            CHECK_EQ(static_cast<int>(wc.opcode), static_cast<int>(ibv::IBV_WC_RDMA_WRITE));
            CHECK_EQ(wc.qp_num, p.qa.qp->qp_num);
            CHECK(std::memcmp(p.bb.data() + off, p.ba.data() + off, len) == 0);
            CHECK_EQ(static_cast<int>(p.bb[off + len]), 0);  // nothing beyond the WR
            if (off) CHECK_EQ(static_cast<int>(p.bb[off - 1]), 0);
            fill(p.bb, seed++);
            REQUIRE_EQ(p.read(off, len, id), 0);
            wc = expect_wc(p.a.cq, id++, ibv::IBV_WC_SUCCESS);
            CHECK_EQ(static_cast<int>(wc.opcode), static_cast<int>(ibv::IBV_WC_RDMA_READ));
            CHECK_EQ(wc.byte_len, len);
            CHECK(std::memcmp(p.ba.data() + off, p.bb.data() + off, len) == 0);
        }
        // Several SGEs gather into one contiguous remote range.
        fill(p.ba, seed++);
        std::fill(p.bb.begin(), p.bb.end(), 0);
        ibv::sge s[3] = {{addr(p.ba.data()), 100, p.ma.mr->lkey},
                         {addr(p.ba.data()) + 5000, 3000, p.ma.mr->lkey},
                         {addr(p.ba.data()) + 9000, 1, p.ma.mr->lkey}};
        ibv::send_wr wr{};
        wr.wr_id = 7;
        wr.sg_list = s;
        wr.num_sge = 3;
        wr.opcode = ibv::IBV_WR_RDMA_WRITE;
        wr.send_flags = ibv::IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = addr(p.bb.data()) + 10;
        wr.wr.rdma.rkey = p.mb.mr->rkey;
        ibv::send_wr *bad = nullptr;
        REQUIRE_EQ(ibv::post_send(p.qa.qp, &wr, &bad), 0);
        expect_wc(p.a.cq, 7, ibv::IBV_WC_SUCCESS);
        CHECK(std::memcmp(p.bb.data() + 10, p.ba.data(), 100) == 0);
        CHECK(std::memcmp(p.bb.data() + 110, p.ba.data() + 5000, 3000) == 0);
        CHECK_EQ(p.bb[3110], p.ba[9000]);
    }
}

TEST(softverbs_unsignaled_and_inline_writes) {
    configure("sv0:roce,sv1:roce");
    Pair p("sv0", "sv1", 8192);
    fill(p.ba, 3);
    ibv::sge s{addr(p.ba.data()), 32, 0 /* ignored for inline */};
    ibv::send_wr w1{}, w2{};
    w1.wr_id = 1;
    w1.sg_list = &s;
    w1.num_sge = 1;
    w1.opcode = ibv::IBV_WR_RDMA_WRITE;
    w1.send_flags = ibv::IBV_SEND_INLINE;  // unsignaled: no completion
    w1.wr.rdma.remote_addr = addr(p.bb.data());
    w1.wr.rdma.rkey = p.mb.mr->rkey;
    w1.next = &w2;
    w2 = w1;
    w2.next = nullptr;
    w2.wr_id = 2;
    w2.send_flags = ibv::IBV_SEND_INLINE | ibv::IBV_SEND_SIGNALED;
    w2.wr.rdma.remote_addr = addr(p.bb.data()) + 100;
    ibv::send_wr *bad = nullptr;
    REQUIRE_EQ(ibv::post_send(p.qa.qp, &w1, &bad), 0);
    std::fill(p.ba.begin(), p.ba.begin() + 32, 0);  // inline data was copied at post time
    expect_wc(p.a.cq, 2, ibv::IBV_WC_SUCCESS);
    ibv::wc extra{};
    CHECK_EQ(ibv::poll_cq(p.a.cq, 1, &extra), 0);
    std::vector<unsigned char> orig(8192);
    fill(orig, 3);
    CHECK(std::memcmp(p.bb.data(), orig.data(), 32) == 0);
    CHECK(std::memcmp(p.bb.data() + 100, orig.data(), 32) == 0);
    // Limits checked at post time.
    s.length = 65;  // above max_inline_data
    w1.next = nullptr;
    CHECK_EQ(ibv::post_send(p.qa.qp, &w1, &bad), EINVAL);
    CHECK(bad == &w1);
    w1.opcode = ibv::IBV_WR_SEND;
    w1.send_flags = 0;
    CHECK_EQ(ibv::post_send(p.qa.qp, &w1, &bad), EINVAL);  // only RDMA READ/WRITE
    ibv::recv_wr rw{};
    ibv::recv_wr *rbad = nullptr;
    CHECK_EQ(ibv::post_recv(p.qb.qp, &rw, &rbad), EOPNOTSUPP);
}

TEST(softverbs_access_violations_fail_the_qp_and_flush) {
    configure("sv0:roce,sv1:roce");
    struct Case {
        const char *what;
        int remote_access;
        uint32_t rkey_delta;
        uint64_t remote_off;
        int status;
    };
    const Case cases[] = {
        {"bad rkey", kAllAccess, 0x10000, ~0ull, ibv::IBV_WC_REM_ACCESS_ERR},
        {"out of bounds", kAllAccess, 0, 4000, ibv::IBV_WC_REM_ACCESS_ERR},
        {"no remote write", ibv::IBV_ACCESS_LOCAL_WRITE | ibv::IBV_ACCESS_REMOTE_READ, 0, ~0ull,
         ibv::IBV_WC_REM_ACCESS_ERR},
    };
    for (const Case &c : cases) {
        std::fprintf(stderr, "    case: %s\n", c.what);
        Pair p("sv0", "sv1", 4096, c.remote_access);
        REQUIRE_EQ(p.write(0, 200, 1, c.rkey_delta, c.remote_off), 0);
        expect_wc(p.a.cq, 1, c.status);
        CHECK_EQ(p.qa.state(), static_cast<int>(ibv::IBV_QPS_ERR));
        CHECK_EQ(p.qb.state(), static_cast<int>(ibv::IBV_QPS_ERR));  // the responder fails too
        ibv::async_event ev{};
        REQUIRE(wait_event(p.b.api, p.b.ctx, ev));
        CHECK_EQ(static_cast<int>(ev.event_type), static_cast<int>(ibv::IBV_EVENT_QP_ACCESS_ERR));
        CHECK(ev.element.qp == p.qb.qp);
        // Later WRs, signaled or not, are flushed.
        REQUIRE_EQ(post_rdma(p.qa.qp, ibv::IBV_WR_RDMA_WRITE, p.ba.data(), 8, p.ma.mr->lkey, addr(p.bb.data()),
                             p.mb.mr->rkey, 2, false),
                   0);
        expect_wc(p.a.cq, 2, ibv::IBV_WC_WR_FLUSH_ERR);
    }
    // Read into local memory without LOCAL_WRITE, or past the local MR.
    Pair p("sv0", "sv1", 4096);
    Mr ro(p.a, p.ba.data(), 4096, ibv::IBV_ACCESS_REMOTE_READ);
    REQUIRE(ro.mr != nullptr);
    REQUIRE_EQ(post_rdma(p.qa.qp, ibv::IBV_WR_RDMA_READ, p.ba.data(), 64, ro.mr->lkey, addr(p.bb.data()),
                         p.mb.mr->rkey, 3),
               0);
    expect_wc(p.a.cq, 3, ibv::IBV_WC_LOC_PROT_ERR);
    CHECK_EQ(p.qa.state(), static_cast<int>(ibv::IBV_QPS_ERR));
    CHECK_EQ(p.qb.state(), static_cast<int>(ibv::IBV_QPS_RTS));  // a local error leaves the peer alone
    Pair q("sv0", "sv1", 4096);
    REQUIRE_EQ(post_rdma(q.qa.qp, ibv::IBV_WR_RDMA_WRITE, q.ba.data() + 4000, 200, q.ma.mr->lkey,
                         addr(q.bb.data()), q.mb.mr->rkey, 4),
               0);
    expect_wc(q.a.cq, 4, ibv::IBV_WC_LOC_PROT_ERR);
}

TEST(softverbs_unreachable_peer_retries_out) {
    configure("sv0:roce,sv1:roce,sv2:ib");
    Dev a("sv0"), b("sv1"), ib("sv2");
    std::vector<char> buf(4096);
    Mr ma(a, buf.data(), 4096, kAllAccess), mb(b, buf.data(), 4096, kAllAccess);
    {
        // Peer QP never connected back (still in INIT).
        Qp qa(a), qb(b);
        bring_up(a, qa, b, qb);
        REQUIRE_EQ(to_init(b.api, qb.qp), 0);
        REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, buf.data(), 8, ma.mr->lkey, addr(buf.data()),
                             mb.mr->rkey, 1),
                   0);
        expect_wc(a.cq, 1, ibv::IBV_WC_RETRY_EXC_ERR);
    }
    {
        // Peer QP destroyed.
        Qp qa(a);
        auto qb = std::make_unique<Qp>(b);
        connect(a, qa, b, *qb);
        qb.reset();
        REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, buf.data(), 8, ma.mr->lkey, addr(buf.data()),
                             mb.mr->rkey, 2),
                   0);
        expect_wc(a.cq, 2, ibv::IBV_WC_RETRY_EXC_ERR);
    }
    {
        // RoCE cannot reach an IB fabric.
        Qp qa(a), qi(ib);
        connect(a, qa, ib, qi);
        REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, buf.data(), 8, ma.mr->lkey, addr(buf.data()),
                             mb.mr->rkey, 3),
                   0);
        expect_wc(a.cq, 3, ibv::IBV_WC_RETRY_EXC_ERR);
    }
}

TEST(softverbs_injected_errors_hit_the_chosen_path) {
    configure("sv0:roce,sv1:roce,sv2:roce");
    Pair to1("sv0", "sv1", 4096);
    Pair to2("sv0", "sv2", 4096);
    REQUIRE_EQ(sv().inject_wc_error("sv0", "sv2", 1, ibv::IBV_WC_REM_OP_ERR), 0);
    CHECK_EQ(sv().inject_wc_error("sv0", "nope", 1, ibv::IBV_WC_REM_OP_ERR), ENODEV);
    CHECK_EQ(sv().inject_wc_error("sv0", nullptr, 1, ibv::IBV_WC_SUCCESS), EINVAL);
    REQUIRE_EQ(to1.write(0, 64, 1), 0);
    expect_wc(to1.a.cq, 1, ibv::IBV_WC_SUCCESS);  // other peer: untouched
    REQUIRE_EQ(to2.write(0, 64, 2), 0);
    expect_wc(to2.a.cq, 2, ibv::IBV_WC_REM_OP_ERR);
    CHECK_EQ(to2.qa.state(), static_cast<int>(ibv::IBV_QPS_ERR));
    // Any peer, two WRs.
    REQUIRE_EQ(sv().inject_wc_error("sv0", nullptr, 2, ibv::IBV_WC_RETRY_EXC_ERR), 0);
    Pair again("sv0", "sv2", 4096);
    REQUIRE_EQ(to1.write(0, 64, 3), 0);
    expect_wc(to1.a.cq, 3, ibv::IBV_WC_RETRY_EXC_ERR);
    REQUIRE_EQ(again.write(0, 64, 4), 0);
    expect_wc(again.a.cq, 4, ibv::IBV_WC_RETRY_EXC_ERR);
    Pair fresh("sv0", "sv1", 4096);
    REQUIRE_EQ(fresh.write(0, 64, 5), 0);
    expect_wc(fresh.a.cq, 5, ibv::IBV_WC_SUCCESS);
    mc_softverbs_counters c{};
    REQUIRE_EQ(sv().get_counters("sv0", &c), 0);
    CHECK_EQ(c.wrs_executed, 5u);
    CHECK_EQ(c.wrs_failed, 3u);
    CHECK_EQ(c.bytes_moved, 128u);
    CHECK_EQ(c.writes, 2u);
    REQUIRE_EQ(sv().get_counters("sv1", &c), 0);
    CHECK_EQ(c.served_wrs, 2u);
    CHECK_EQ(c.served_bytes, 128u);
    CHECK_EQ(sv().get_counters("zz", &c), ENODEV);
}

TEST(softverbs_qp_fatal_and_port_events) {
    configure("sv0:roce,sv1:roce");
    Pair p("sv0", "sv1", 4096);
    ibv::async_event ev{};
    REQUIRE_EQ(sv().set_qp_error("sv0", p.qa.qp->qp_num), 0);
    REQUIRE(wait_event(p.a.api, p.a.ctx, ev));
    CHECK_EQ(static_cast<int>(ev.event_type), static_cast<int>(ibv::IBV_EVENT_QP_FATAL));
    CHECK(ev.element.qp == p.qa.qp);
    CHECK_EQ(p.qa.state(), static_cast<int>(ibv::IBV_QPS_ERR));
    REQUIRE_EQ(p.write(0, 64, 1), 0);
    expect_wc(p.a.cq, 1, ibv::IBV_WC_WR_FLUSH_ERR);

    Pair r("sv0", "sv1", 4096);
    REQUIRE_EQ(sv().set_port_state("sv1", 0), 0);
    REQUIRE(wait_event(r.b.api, r.b.ctx, ev));
    CHECK_EQ(static_cast<int>(ev.event_type), static_cast<int>(ibv::IBV_EVENT_PORT_ERR));
    CHECK_EQ(ev.element.port_num, 1);
    ibv::port_attr pa{};
    REQUIRE_EQ(sv().lib->query_port(r.b.ctx, 1, &pa), 0);
    CHECK_EQ(static_cast<int>(pa.state), static_cast<int>(ibv::IBV_PORT_DOWN));
    int n = 0;
    ibv::device **list = r.a.api.get_device_list(&n);
    std::string ibdev = list[1]->ibdev_path;
    r.a.api.free_device_list(list);
    CHECK_EQ(read_text(ibdev + "/ports/1/state"), std::string("1: DOWN"));
    REQUIRE_EQ(r.write(0, 64, 2), 0);
    expect_wc(r.a.cq, 2, ibv::IBV_WC_RETRY_EXC_ERR);
    REQUIRE_EQ(sv().set_port_state("sv1", 1), 0);
    REQUIRE(wait_event(r.b.api, r.b.ctx, ev));
    CHECK_EQ(static_cast<int>(ev.event_type), static_cast<int>(ibv::IBV_EVENT_PORT_ACTIVE));
    CHECK_EQ(read_text(ibdev + "/ports/1/state"), std::string("4: ACTIVE"));
    // Nothing else pending: a non-blocking read says so.
    CHECK_EQ(r.a.api.get_async_event(r.b.ctx, &ev), -1);
    CHECK_EQ(errno, EAGAIN);
}

TEST(softverbs_send_queue_and_cq_limits) {
    configure("sv0:roce,sv1:roce");
    Dev a("sv0"), b("sv1");
    std::vector<unsigned char> la(4096), lb(4096);
    Mr ma(a, la.data(), la.size(), kAllAccess), mb(b, lb.data(), lb.size(), kAllAccess);
    {
        Qp qa(a, 4), qb(b, 4);
        connect(a, qa, b, qb);
        // Unsignaled WRs keep their slots until a later completion is polled.
        for (int i = 0; i < 3; ++i)
            REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, la.data(), 8, ma.mr->lkey, addr(lb.data()),
                                 mb.mr->rkey, 10 + i, false),
                       0);
        REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, la.data(), 8, ma.mr->lkey, addr(lb.data()),
                             mb.mr->rkey, 13, true),
                   0);
        CHECK_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, la.data(), 8, ma.mr->lkey, addr(lb.data()),
                           mb.mr->rkey, 14),
                 ENOMEM);
        expect_wc(a.cq, 13, ibv::IBV_WC_SUCCESS);
        for (int i = 0; i < 4; ++i)
            CHECK_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, la.data(), 8, ma.mr->lkey, addr(lb.data()),
                               mb.mr->rkey, 20 + i),
                     0);
        for (int i = 0; i < 4; ++i) expect_wc(a.cq, 20 + i, ibv::IBV_WC_SUCCESS);
    }
    {
        // A CQ that overflows loses the completion and reports CQ_ERR.
        ibv::cq *small = a.api.create_cq(a.ctx, 2, nullptr, nullptr, 0);
        REQUIRE(small != nullptr);
        {
            Qp qa(a, 16, small), qb(b);
            connect(a, qa, b, qb);
            REQUIRE_EQ(sv().set_paused("sv0", 1), 0);
            for (int i = 0; i < 3; ++i)
                REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, la.data(), 8, ma.mr->lkey, addr(lb.data()),
                                     mb.mr->rkey, 30 + i),
                           0);
            CHECK_EQ(sv().pending("sv0"), 3);
            REQUIRE_EQ(sv().set_paused("sv0", 0), 0);
            ibv::async_event ev{};
            REQUIRE(wait_event(a.api, a.ctx, ev));
            CHECK_EQ(static_cast<int>(ev.event_type), static_cast<int>(ibv::IBV_EVENT_CQ_ERR));
            CHECK(ev.element.cq == small);
            ibv::wc wcs[4];
            CHECK_EQ(ibv::poll_cq(small, 4, wcs), 2);
            CHECK_EQ(qa.state(), static_cast<int>(ibv::IBV_QPS_ERR));
            CHECK_EQ(a.api.destroy_cq(small), EBUSY);  // a QP still uses it
        }
        CHECK_EQ(a.api.destroy_cq(small), 0);
    }
    ibv::cq *huge = a.api.create_cq(a.ctx, 1 << 30, nullptr, nullptr, 0);
    CHECK(huge == nullptr);
}

TEST(softverbs_completion_channel_wakes_the_waiter) {
    configure("sv0:roce,sv1:roce");
    Dev a("sv0"), b("sv1");
    const ibv::VerbsApi &api = a.api;
    ibv::comp_channel *ch = api.create_comp_channel(a.ctx);
    REQUIRE(ch != nullptr);
    int tag = 0;
    ibv::cq *cq = api.create_cq(a.ctx, 16, &tag, ch, 0);
    REQUIRE(cq != nullptr);
    CHECK_EQ(api.destroy_comp_channel(ch), EBUSY);
    std::vector<char> la(64), lb(64);
    {
        Mr ma(a, la.data(), 64, kAllAccess), mb(b, lb.data(), 64, kAllAccess);
        Qp qa(a, 16, cq), qb(b);
        connect(a, qa, b, qb);
        REQUIRE_EQ(ibv::req_notify_cq(cq, 0), 0);
        REQUIRE_EQ(post_rdma(qa.qp, ibv::IBV_WR_RDMA_WRITE, la.data(), 8, ma.mr->lkey, addr(lb.data()),
                             mb.mr->rkey, 5),
                   0);
        pollfd p{ch->fd, POLLIN, 0};
        REQUIRE_EQ(poll(&p, 1, 5000), 1);
        ibv::cq *ev_cq = nullptr;
        void *ev_ctx = nullptr;
        REQUIRE_EQ(api.get_cq_event(ch, &ev_cq, &ev_ctx), 0);
        CHECK(ev_cq == cq);
        CHECK(ev_ctx == &tag);
        api.ack_cq_events(ev_cq, 1);
        expect_wc(cq, 5, ibv::IBV_WC_SUCCESS);
    }
    CHECK_EQ(api.destroy_cq(cq), 0);
    CHECK_EQ(api.destroy_comp_channel(ch), 0);
}

TEST(softverbs_concurrent_posters_one_poller) {
    configure("sv0:roce,sv1:roce,sv2:roce");
    const int kThreads = 4, kPerThread = 300;
    const uint32_t kChunk = 1024;
    Dev a("sv0", 64), b("sv1"), c("sv2");
    std::vector<unsigned char> src(kThreads * kPerThread * kChunk), dst_b(src.size()), dst_c(src.size());
    fill(src, 42);
    Mr ms(a, src.data(), src.size(), kAllAccess);
    Mr mb(b, dst_b.data(), dst_b.size(), kAllAccess), mc(c, dst_c.data(), dst_c.size(), kAllAccess);
    REQUIRE(ms.mr && mb.mr && mc.mr);
    // Threads 0/1 write to sv1, 2/3 to sv2, each on its own QP, one shared CQ.
    std::vector<std::unique_ptr<Qp>> local, remote;
    for (int t = 0; t < kThreads; ++t) {
        Dev &peer = t < 2 ? b : c;
        local.push_back(std::make_unique<Qp>(a, 16));
        remote.push_back(std::make_unique<Qp>(peer, 16));
        connect(a, *local.back(), peer, *remote.back());
    }
    std::atomic<int> done{0};
    std::atomic<int> in_flight[kThreads] = {};
    std::vector<std::thread> posters;
    for (int t = 0; t < kThreads; ++t) {
        posters.emplace_back([&, t] {
            unsigned char *dst = t < 2 ? dst_b.data() : dst_c.data();
            uint32_t rkey = t < 2 ? mb.mr->rkey : mc.mr->rkey;
            for (int i = 0; i < kPerThread; ++i) {
                size_t off = (static_cast<size_t>(t) * kPerThread + i) * kChunk;
                // Stay within the send queue and the 64-entry CQ.
                while (in_flight[t].load() >= 12) std::this_thread::yield();
                in_flight[t].fetch_add(1);
                int rc = post_rdma(local[t]->qp, ibv::IBV_WR_RDMA_WRITE, src.data() + off, kChunk, ms.mr->lkey,
                                   addr(dst) + off, rkey, (static_cast<uint64_t>(t) << 32) | i);
                if (rc != 0) {
                    in_flight[t].fetch_sub(1);
                    done.fetch_add(1000000);  // poison: makes the check below fail
                    return;
                }
            }
        });
    }
    int ok = 0, bad = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (ok + bad < kThreads * kPerThread && std::chrono::steady_clock::now() < deadline &&
           done.load() < 1000000) {
        ibv::wc wcs[16];
        int n = ibv::poll_cq(a.cq, 16, wcs);
        for (int k = 0; k < n; ++k) {
            (wcs[k].status == ibv::IBV_WC_SUCCESS ? ok : bad)++;
            in_flight[wcs[k].wr_id >> 32].fetch_sub(1);
        }
        if (n == 0) std::this_thread::yield();
    }
    for (auto &th : posters) th.join();
    CHECK_EQ(done.load(), 0);
    CHECK_EQ(ok, kThreads * kPerThread);
    CHECK_EQ(bad, 0);
    size_t half = src.size() / 2;
    CHECK(std::memcmp(dst_b.data(), src.data(), half) == 0);
    CHECK(std::memcmp(dst_c.data() + half, src.data() + half, half) == 0);
    // The traffic was striped over both peer devices.
    mc_softverbs_counters cb{}, cc{}, ca{};
    sv().get_counters("sv0", &ca);
    sv().get_counters("sv1", &cb);
    sv().get_counters("sv2", &cc);
    CHECK_EQ(ca.bytes_moved, uint64_t(src.size()));
    CHECK_EQ(cb.served_bytes, uint64_t(half));
    CHECK_EQ(cc.served_bytes, uint64_t(half));
    remote.clear();
    local.clear();
}

TEST(softverbs_close_device_frees_leftovers) {
    configure("sv0:roce");
    const ibv::VerbsApi &api = sv().api();
    int n = 0;
    ibv::device **list = api.get_device_list(&n);
    REQUIRE_EQ(n, 1);
    ibv::context *ctx = api.open_device(list[0]);
    api.free_device_list(list);
    REQUIRE(ctx != nullptr);
    ibv::pd *pd = api.alloc_pd(ctx);
    ibv::comp_channel *ch = api.create_comp_channel(ctx);
    ibv::cq *cq = api.create_cq(ctx, 8, nullptr, ch, 0);
    std::vector<char> buf(4096);
    ibv::mr *mr = api.reg_mr(pd, buf.data(), buf.size(), kAllAccess);
    ibv::qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.cap.max_send_wr = 4;
    init.qp_type = ibv::IBV_QPT_RC;
    ibv::qp *qp = api.create_qp(pd, &init);
    CHECK(pd && ch && cq && mr && qp);
    // The kernel frees what a closing process left; so does the stand-in
    // (ASan's leak check proves it).
    CHECK_EQ(api.close_device(ctx), 0);
    CHECK_EQ(sv().configure("sv0:roce"), 0);  // no context left open
}
