// The RDMA endpoint exchange body on both sides: decode_handshake on the
// JSON a peer sends, then the passive checks (against each endpoint state)
// and the active reply checks. A usable body re-encodes to the same fields.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/json.h"
#include "fuzz_check.h"
#include "transport/rdma/handshake_desc.h"

using namespace mcrs;
using namespace mcrs::rdma;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    HandShakeDesc d;
    try {
        d = decode_handshake(Json::parse(text));
    } catch (const Error &) {
        return 0;
    }
    FUZZ_CHECK(d.qp_num.size() <= kMaxQpPerEndpoint, "qp_num unbounded");
    for (uint32_t q : d.qp_num) FUZZ_CHECK(q <= kMaxQpNum, "qp_num over 24 bits");
    FUZZ_CHECK(d.local_lid <= 0xFFFF, "lid over 16 bits");

    const std::string own_server = "127.0.0.1:17001";
    const std::vector<std::string> devices = {"mlx5_0", "mlx5_1"};
    EndpointView views[3];
    views[1].state = EndpointState::WaitReadyAck;
    views[1].peer_nic_path = "127.0.0.1:17002@mlx5_0";
    views[1].peer_qp_num = {17, 18};
    views[2] = views[1];
    views[2].state = EndpointState::Connected;
    for (const EndpointView &ep : views) {
        PassiveDecision p = check_passive_request(d, own_server, devices, 2, ep);
        if (p.action == PassiveAction::Reject) {
            FUZZ_CHECK(!p.reply_msg.empty(), "reject without a reason");
            // Peer text in our reasons is bounded.
            FUZZ_CHECK(p.reply_msg.size() < 2048, "unbounded reject reason");
        } else {
            FUZZ_CHECK(d.decode_problem.empty(), "accepted a malformed body");
            FUZZ_CHECK(p.local_device == "mlx5_0" || p.local_device == "mlx5_1",
                       "accepted a device we do not have");
        }
        if (p.action == PassiveAction::Connect || p.action == PassiveAction::Rebuild)
            FUZZ_CHECK(d.qp_num.size() == 2, "connect with a wrong QP count");
    }
    ActiveCheck a = check_active_reply(d, "127.0.0.1:17002@mlx5_0", "127.0.0.1:17001@mlx5_1", 2);
    if (a.ok) FUZZ_CHECK(d.qp_num.size() == 2 && d.reply_msg.empty(), "bad reply accepted");
    else FUZZ_CHECK(a.error.size() < 4096, "unbounded error");
    check_ack_reply(d);

    if (d.decode_problem.empty()) {
        HandShakeDesc e = decode_handshake(Json::parse(encode_handshake(d).dump()));
        FUZZ_CHECK(e.local_nic_path == d.local_nic_path && e.peer_nic_path == d.peer_nic_path &&
                       e.local_gid == d.local_gid && e.local_lid == d.local_lid &&
                       e.payload == d.payload && e.qp_num == d.qp_num &&
                       e.reply_msg == d.reply_msg && e.ready_ack == d.ready_ack &&
                       e.notify_qp_num == d.notify_qp_num &&
                       e.notify_rq_depth == d.notify_rq_depth &&
                       e.ctrl_channel == d.ctrl_channel && e.decode_problem.empty(),
                   "handshake round trip");
    }
    return 0;
}
