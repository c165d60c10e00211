// The RDMA endpoint handshake body and the checks both sides apply to it,
// as pure functions (docs/wire-protocol.md, RDMA endpoint handshake). The
// transport owns the QPs and the endpoint table; these functions only say
// what to do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/json.h"

namespace mcrs::rdma {

// QP numbers are 24 bits on the wire of every verbs provider.
constexpr uint32_t kMaxQpNum = 0xFFFFFF;
// MC_NUM_QP_PER_EP is at most 255; a longer qp_num list is hostile.
constexpr size_t kMaxQpPerEndpoint = 255;

struct HandShakeDesc {
    std::string local_nic_path;
    std::string peer_nic_path;
    std::string local_gid;
    uint32_t local_lid = 0;
    std::string payload;
    std::vector<uint32_t> qp_num;
    std::string reply_msg;
    // nullopt = key absent (sender does not support the ready-ACK step);
    // true marks the ACK message itself.
    std::optional<bool> ready_ack;
    // [wheel] two-sided notify channel; written only when non-zero / true.
    uint32_t notify_qp_num = 0;
    uint32_t notify_rq_depth = 0;
    bool ctrl_channel = false;

    // Filled by decode only: why the body cannot be used even though the
    // lenient rules accepted it ("" when fine): a qp_num element that is not
    // a 24-bit number, or more than kMaxQpPerEndpoint of them.
    std::string decode_problem;

    bool is_ack() const { return ready_ack.value_or(false); }
    bool supports_ready_ack() const { return ready_ack.has_value(); }
};

// Keys in sorted order (the Json writer sorts), like upstream's FastWriter.
Json encode_handshake(const HandShakeDesc &d);
// Lenient, as upstream: missing or non-string strings -> ""; local_lid not a
// uint (or over 16 bits) -> 0; qp_num not an array -> []; ready_ack support
// = the key is present, is_ack = its value is the boolean true; notify keys
// as uints / bool else 0 / false. Hostile qp_num content is recorded in
// decode_problem (the list is then truncated) rather than thrown. Only a
// body that is not a JSON object throws Error(kErrMalformedJson).
HandShakeDesc decode_handshake(const Json &j);

// What a TCP-only engine answers to a Connection request:
// {"local_gid":"","local_lid":0,"local_nic_path":"","payload":"","peer_nic_path":"","qp_num":[],"reply_msg":""}
HandShakeDesc empty_handshake();
// The same all-empty shape with a rejection reason.
HandShakeDesc reject_handshake(const std::string &reason);
// True when every field is empty (the TCP-only / ACK reply).
bool handshake_is_empty(const HandShakeDesc &d);

// "<server>@<device>", split at the last '@'; false when either part is
// empty or there is no '@'.
bool split_nic_path(const std::string &nic_path, std::string &server, std::string &device);
std::string make_nic_path(const std::string &server, const std::string &device);

// Steps 1 and 4 of the handshake sequence (active side).
HandShakeDesc make_request(const std::string &own_nic_path, const std::string &target_nic_path,
                           uint32_t lid, const std::string &gid,
                           const std::vector<uint32_t> &qp_num);
HandShakeDesc make_ack(const HandShakeDesc &request);

// ---- passive side ----------------------------------------------------------

enum class EndpointState { None, WaitReadyAck, Connected };

// What the passive side knows about the endpoint keyed by the request's
// local_nic_path.
struct EndpointView {
    EndpointState state = EndpointState::None;
    std::string peer_nic_path;            // the path the endpoint was built for
    std::vector<uint32_t> peer_qp_num;    // the QPs it is connected to
};

enum class PassiveAction {
    Reject,       // reply reject_handshake(reply_msg)
    Connect,      // new endpoint: move QPs to RTS against request.qp_num, reply own desc
    Reuse,        // already connected to these QPs: reply own desc, change nothing
    Rebuild,      // connected to other QPs (peer restarted): tear down, then Connect
    AckAccepted,  // ready-ACK matches: endpoint CONNECTED, reply empty_handshake()
};

struct PassiveDecision {
    PassiveAction action = PassiveAction::Reject;
    std::string reply_msg;          // non-empty for Reject
    std::string local_device;       // device part of request.peer_nic_path
    bool wait_for_ack = false;      // Connect/Rebuild: stay WaitReadyAck until the ACK
    bool gid_from_descriptor = false;  // request.local_gid is empty: take devices[] of the peer
};

// Checks a Connection request against our identity. `own_server_name` is
// the text before '@' of our NIC paths, `own_devices` our device names and
// `own_qp_count` MC_NUM_QP_PER_EP.
PassiveDecision check_passive_request(const HandShakeDesc &request,
                                      const std::string &own_server_name,
                                      const std::vector<std::string> &own_devices,
                                      size_t own_qp_count, const EndpointView &endpoint);

// ---- active side -----------------------------------------------------------

struct ActiveCheck {
    bool ok = false;
    std::string error;              // for ERR_REJECT_HANDSHAKE when !ok
    bool send_ready_ack = false;    // the reply carried the ready_ack key
    bool gid_from_descriptor = false;
};

// Validates the reply to make_request (step 3): no reply_msg, paths
// mirrored, same QP count, valid QP numbers and GID. An all-empty reply
// means the peer has no RDMA transport (TCP-only engine) and says so.
ActiveCheck check_active_reply(const HandShakeDesc &reply, const std::string &own_nic_path,
                               const std::string &target_nic_path, size_t own_qp_count);
// Validates the reply to make_ack: anything without reply_msg is fine.
ActiveCheck check_ack_reply(const HandShakeDesc &reply);

// The QP count mismatch text (names MC_NUM_QP_PER_EP, unlike upstream).
std::string qp_count_mismatch_message(size_t theirs, size_t ours);

}  // namespace mcrs::rdma
