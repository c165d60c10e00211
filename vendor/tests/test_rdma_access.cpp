// RDMA access rights are the NIC's to enforce: a buffer registered as
// local-only gets no remote access flags, so even a peer that knows its
// address and key (here: a forged descriptor carrying the real rkeys, read
// from the stand-in) has its READ and WRITE refused by the responder, and
// the buffer's bytes neither leak nor change. The softverbs stand-in
// enforces access flags as verbs hardware does (sv_exec.cpp).
#include <cstring>

#include "core/batch.h"
#include "engine_fixture.h"
#include "transfer_engine_c.h"
#include "rdma_engine_fixture.h"
#include "transport/rdma/rdma_transport.h"

using namespace rdmatest;

namespace {

// Submits one request straight to the initiator's RDMA transport against
// `peer` (bypassing the descriptor the engine fetched) and returns its
// final status and error text.
int submit_raw(TransferEngine &e, const std::shared_ptr<const mcrs::SegmentDesc> &peer, int opcode, char *local,
               uint64_t remote, uint64_t len, std::string &why) {
    auto batch = std::make_shared<mcrs::Batch>(1, 1);
    auto first = batch->reserve(1);
    REQUIRE(first.has_value());
    std::vector<mcrs::TransferItem> items(1);
    items[0].batch = batch;
    items[0].task = *first;
    items[0].opcode = opcode;
    items[0].local = local;
    items[0].remote_addr = remote;
    items[0].length = len;
    e.rdma()->submit(peer, items);
    REQUIRE(batch->wait(10000));
    uint64_t bytes = 0;
    int st = batch->observe(0, &bytes);
    why = batch->task(0).error;
    return st;
}

}  // namespace

TEST(rdma_local_only_buffer_refuses_remote_read_and_write) {
    svtest::configure("sv0:roce:numa=0,sv1:roce:numa=0");
    EnvGuard lib("MC_VERBS_LIBRARY", svtest::softverbs_path());
    Pair p = make_pair_engines({"sv0"}, {"sv1"});
    REQUIRE(p.a->rdma() != nullptr && p.b->rdma() != nullptr);
    const size_t kLen = 1u << 16;
    std::vector<char> local(kLen, 'L'), shared(kLen), secret(kLen);
    mctest::fill_random(shared, 3);
    mctest::fill_random(secret, 11);
    const std::vector<char> secret_copy = secret;
    p.a->register_memory(local.data(), kLen, "cpu:0", true);
    p.b->register_memory(shared.data(), kLen, "cpu:0", true);
    p.b->register_memory(secret.data(), kLen, "cpu:0", /*remote=*/false);
    p.seg = p.a->open_segment(p.b->segment_name(), false);
    auto real = p.a->segment_desc(p.seg);
    REQUIRE(real != nullptr);
    REQUIRE_EQ(real->devices.size(), 1u);

    // The NIC gave the local-only buffer no remote rights.
    mc_softverbs_mr_info mr{};
    REQUIRE_EQ(svtest::sv().find_mr("sv1", reinterpret_cast<uint64_t>(secret.data()), &mr), 0);

    // A hostile initiator's view: the local-only buffer listed with the real rkey.
    auto forged = std::make_shared<mcrs::SegmentDesc>(*real);
    bool listed = false;
    for (auto &b : forged->buffers)
        if (b.addr == reinterpret_cast<uint64_t>(secret.data())) {
            b.rkey.assign(1, mr.rkey);
            listed = true;
        }
    if (!listed) {
        mcrs::BufferDesc b;
        b.name = "cpu:0";
        b.addr = reinterpret_cast<uint64_t>(secret.data());
        b.length = kLen;
        b.lkey.assign(1, mr.lkey);
        b.rkey.assign(1, mr.rkey);
        forged->buffers.push_back(b);
    }

    std::string why;
    CHECK_EQ(submit_raw(*p.a, forged, OPCODE_READ, local.data(), reinterpret_cast<uint64_t>(secret.data()), 4096, why),
             STATUS_FAILED);
    CHECK(!why.empty());
    // Nothing leaked into the initiator's buffer.
    CHECK(std::memcmp(local.data(), std::vector<char>(4096, 'L').data(), 4096) == 0);
    CHECK_EQ(submit_raw(*p.a, forged, OPCODE_WRITE, local.data(), reinterpret_cast<uint64_t>(secret.data()), 4096, why),
             STATUS_FAILED);
    CHECK(secret == secret_copy);

    // The remote-accessible buffer still works through the same engines.
    CHECK_EQ(run_one(*p.a, p.seg, OPCODE_READ, local.data(), reinterpret_cast<uint64_t>(shared.data()), kLen, &why),
             STATUS_COMPLETED);
    CHECK(std::memcmp(local.data(), shared.data(), kLen) == 0);
    p.a->unregister_memory(local.data());
    p.b->unregister_memory(shared.data());
    p.b->unregister_memory(secret.data());
}
