#include "transport/rdma/handshake_desc.h"

#include <algorithm>

#include "common/error.h"
#include "transport/rdma/gid.h"

namespace mcrs::rdma {

Json encode_handshake(const HandShakeDesc &d) {
    Json j = Json::object();
    j.set("local_gid", d.local_gid);
    j.set("local_lid", static_cast<uint64_t>(d.local_lid));
    j.set("local_nic_path", d.local_nic_path);
    j.set("payload", d.payload);
    j.set("peer_nic_path", d.peer_nic_path);
    Json qps = Json::array();
    for (uint32_t q : d.qp_num) qps.push(static_cast<uint64_t>(q));
    j.set("qp_num", qps);
    if (d.ready_ack) j.set("ready_ack", *d.ready_ack);
    j.set("reply_msg", d.reply_msg);
    if (d.notify_qp_num != 0) j.set("notify_qp_num", static_cast<uint64_t>(d.notify_qp_num));
    if (d.notify_rq_depth != 0) j.set("notify_rq_depth", static_cast<uint64_t>(d.notify_rq_depth));
    if (d.ctrl_channel) j.set("ctrl_channel", true);
    return j;
}

namespace {

uint32_t uint_or_zero(const Json &j, const char *key, uint64_t max) {
    const Json *v = j.find(key);
    uint64_t x = 0;
    if (!v || !v->get_u64(x) || x > max) return 0;
    return static_cast<uint32_t>(x);
}

}  // namespace

HandShakeDesc decode_handshake(const Json &j) {
    if (!j.is_object()) throw Error(kErrMalformedJson, "handshake body is not a JSON object");
    HandShakeDesc d;
    d.local_nic_path = json_string_or(j, "local_nic_path", "");
    d.peer_nic_path = json_string_or(j, "peer_nic_path", "");
    d.local_gid = json_string_or(j, "local_gid", "");
    d.payload = json_string_or(j, "payload", "");
    d.reply_msg = json_string_or(j, "reply_msg", "");
    d.local_lid = uint_or_zero(j, "local_lid", 0xFFFF);
    if (const Json *q = j.find("qp_num")) {
        if (const Json::Array *a = q->get_array()) {
            if (a->size() > kMaxQpPerEndpoint) {
                d.decode_problem = "qp_num has " + std::to_string(a->size()) +
                                   " entries, more than the " +
                                   std::to_string(kMaxQpPerEndpoint) + " QPs an endpoint may have";
            } else {
                for (size_t i = 0; i < a->size(); ++i) {
                    uint64_t x = 0;
                    if (!(*a)[i].get_u64(x) || x > kMaxQpNum) {
                        d.decode_problem = "qp_num[" + std::to_string(i) +
                                           "] is not a 24-bit QP number";
                        d.qp_num.clear();
                        break;
                    }
                    d.qp_num.push_back(static_cast<uint32_t>(x));
                }
            }
        }
    }
    if (const Json *r = j.find("ready_ack")) {
        bool b = false;
        d.ready_ack = r->get_bool(b) && b;
    }
    d.notify_qp_num = uint_or_zero(j, "notify_qp_num", kMaxQpNum);
    d.notify_rq_depth = uint_or_zero(j, "notify_rq_depth", 0xFFFFFFFFull);
    if (const Json *c = j.find("ctrl_channel")) c->get_bool(d.ctrl_channel);
    return d;
}

HandShakeDesc empty_handshake() { return HandShakeDesc{}; }

HandShakeDesc reject_handshake(const std::string &reason) {
    HandShakeDesc d;
    d.reply_msg = reason.empty() ? "Handshake callback failed" : reason;
    return d;
}

bool handshake_is_empty(const HandShakeDesc &d) {
    return d.local_nic_path.empty() && d.peer_nic_path.empty() && d.local_gid.empty() &&
           d.local_lid == 0 && d.payload.empty() && d.qp_num.empty() && d.reply_msg.empty();
}

bool split_nic_path(const std::string &nic_path, std::string &server, std::string &device) {
    size_t at = nic_path.rfind('@');
    if (at == std::string::npos || at == 0 || at + 1 >= nic_path.size()) return false;
    server = nic_path.substr(0, at);
    device = nic_path.substr(at + 1);
    return true;
}

std::string make_nic_path(const std::string &server, const std::string &device) {
    return server + "@" + device;
}

HandShakeDesc make_request(const std::string &own_nic_path, const std::string &target_nic_path,
                           uint32_t lid, const std::string &gid,
                           const std::vector<uint32_t> &qp_num) {
    HandShakeDesc d;
    d.local_nic_path = own_nic_path;
    d.peer_nic_path = target_nic_path;
    d.local_lid = lid;
    d.local_gid = gid;
    d.qp_num = qp_num;
    d.ready_ack = false;
    return d;
}

HandShakeDesc make_ack(const HandShakeDesc &request) {
    HandShakeDesc d = request;
    d.ready_ack = true;
    d.reply_msg.clear();
    return d;
}

std::string qp_count_mismatch_message(size_t theirs, size_t ours) {
    return "QP count mismatch: the peer's endpoint has " + std::to_string(theirs) +
           " QP(s), ours has " + std::to_string(ours) +
           "; set MC_NUM_QP_PER_EP to the same value on both sides";
}

namespace {

// Peer-supplied text in our messages: bounded and printable.
std::string quote(const std::string &s) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < 128; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
    }
    if (s.size() > 128) out += "...";
    return out + "\"";
}

std::string qp_list(const std::vector<uint32_t> &v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size() && i < 16; ++i) out += (i ? "," : "") + std::to_string(v[i]);
    if (v.size() > 16) out += ",...";
    return out + "]";
}

bool gid_ok(const std::string &gid) { return gid.empty() || parse_gid(gid).has_value(); }

}  // namespace

PassiveDecision check_passive_request(const HandShakeDesc &req, const std::string &own_server_name,
                                      const std::vector<std::string> &own_devices,
                                      size_t own_qp_count, const EndpointView &ep) {
    PassiveDecision d;
    auto reject = [&](const std::string &why) {
        d.action = PassiveAction::Reject;
        d.reply_msg = why;
        d.wait_for_ack = false;
        return d;
    };
    if (!req.decode_problem.empty()) return reject("malformed handshake: " + req.decode_problem);
    std::string server, device, peer_server, peer_device;
    if (!split_nic_path(req.peer_nic_path, server, device))
        return reject("malformed peer_nic_path " + quote(req.peer_nic_path) +
                      " (expected <server>@<device>)");
    if (server != own_server_name)
        return reject("peer_nic_path " + quote(req.peer_nic_path) + " does not belong to " +
                      quote(own_server_name));
    if (std::find(own_devices.begin(), own_devices.end(), device) == own_devices.end())
        return reject("device " + quote(device) + " not found on " + quote(own_server_name));
    d.local_device = device;
    if (!split_nic_path(req.local_nic_path, peer_server, peer_device))
        return reject("malformed local_nic_path " + quote(req.local_nic_path) +
                      " (expected <server>@<device>)");
    if (ep.state != EndpointState::None && ep.peer_nic_path != req.local_nic_path)
        return reject("endpoint for " + quote(req.local_nic_path) + " is connected to " +
                      quote(ep.peer_nic_path));
    if (req.is_ack()) {
        if (ep.state == EndpointState::None)
            return reject("stale ready ACK from " + quote(req.local_nic_path) +
                          ": no endpoint is waiting for it");
        if (req.qp_num != ep.peer_qp_num)
            return reject("stale ready ACK from " + quote(req.local_nic_path) + ": QPs " +
                          qp_list(req.qp_num) + " differ from the connected " +
                          qp_list(ep.peer_qp_num));
        d.action = PassiveAction::AckAccepted;  // also a repeated ACK on CONNECTED
        return d;
    }
    if (req.qp_num.size() != own_qp_count)
        return reject(qp_count_mismatch_message(req.qp_num.size(), own_qp_count));
    if (!gid_ok(req.local_gid)) return reject("local_gid " + quote(req.local_gid) + " is not a GID");
    d.gid_from_descriptor = req.local_gid.empty();
    d.wait_for_ack = req.supports_ready_ack();
    if (ep.state == EndpointState::None) {
        d.action = PassiveAction::Connect;
    } else if (req.qp_num == ep.peer_qp_num) {
        d.action = PassiveAction::Reuse;
        d.wait_for_ack = ep.state == EndpointState::WaitReadyAck;
    } else {
        d.action = PassiveAction::Rebuild;
    }
    return d;
}

ActiveCheck check_active_reply(const HandShakeDesc &reply, const std::string &own_nic_path,
                               const std::string &target_nic_path, size_t own_qp_count) {
    ActiveCheck c;
    auto fail = [&](const std::string &why) {
        c.ok = false;
        c.error = "handshake with " + target_nic_path + " failed: " + why;
        return c;
    };
    if (!reply.decode_problem.empty()) return fail("malformed reply: " + reply.decode_problem);
    if (!reply.reply_msg.empty()) return fail("peer rejected it: " + quote(reply.reply_msg));
    if (handshake_is_empty(reply))
        return fail("the peer answered with an empty handshake; it has no RDMA transport "
                    "(a TCP-only engine). Use TCP for this segment or enable RDMA on the peer");
    if (reply.local_nic_path != target_nic_path)
        return fail("the reply comes from " + quote(reply.local_nic_path));
    if (reply.peer_nic_path != own_nic_path)
        return fail("the reply is addressed to " + quote(reply.peer_nic_path) + ", not to us");
    if (reply.qp_num.size() != own_qp_count)
        return fail(qp_count_mismatch_message(reply.qp_num.size(), own_qp_count));
    if (!gid_ok(reply.local_gid)) return fail("local_gid " + quote(reply.local_gid) + " is not a GID");
    c.ok = true;
    c.send_ready_ack = reply.supports_ready_ack();
    c.gid_from_descriptor = reply.local_gid.empty();
    return c;
}

ActiveCheck check_ack_reply(const HandShakeDesc &reply) {
    ActiveCheck c;
    if (!reply.reply_msg.empty()) {
        c.error = "ready ACK rejected: " + quote(reply.reply_msg);
        return c;
    }
    c.ok = true;
    return c;
}

}  // namespace mcrs::rdma
