#include "core/segment_descriptor.h"

#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>

#include "common/error.h"
#include "common/range.h"

namespace mcrs {

std::string descriptor_timestamp() {
    struct timeval tv;
    gettimeofday(&tv, nullptr);
    struct tm tm;
    time_t secs = tv.tv_sec;
    localtime_r(&secs, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%06ld", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long>(tv.tv_usec));
    return buf;
}

Json encode_segment_desc(const SegmentDesc &d) {
    Json j = Json::object();
    j.set("name", d.name);
    j.set("protocol", d.protocol);
    j.set("tcp_data_port", static_cast<int>(d.tcp_data_port));
    j.set("tcp_proto_version", d.tcp_proto_version);
    if (!d.tcp_data_host.empty()) j.set("tcp_data_host", d.tcp_data_host);
    j.set("rdma_server_name", d.rdma_server_name);
    j.set("timestamp", descriptor_timestamp());
    if (!d.host_id.empty()) j.set("mc_host_id", d.host_id);
    if (!d.process_token.empty()) j.set("mc_process", d.process_token);
    if (!d.same_host_socket.empty()) j.set("mc_same_host", d.same_host_socket);
    Json bufs = Json::array();
    bool rdma = d.protocol != "tcp";
    for (const auto &b : d.buffers) {
        Json e = Json::object();
        e.set("addr", b.addr);
        e.set("length", b.length);
        e.set("name", b.name);
        if (!b.cuda_ipc.empty()) {
            e.set("mc_cuda_ipc", b.cuda_ipc);
            e.set("mc_cuda_ipc_offset", b.cuda_ipc_offset);
            e.set("mc_cuda_device", b.cuda_device);
        }
        if (rdma) {
            Json lk = Json::array(), rk = Json::array();
            for (uint32_t k : b.lkey) lk.push(Json(static_cast<uint64_t>(k)));
            for (uint32_t k : b.rkey) rk.push(Json(static_cast<uint64_t>(k)));
            e.set("lkey", lk);
            e.set("rkey", rk);
        }
        bufs.push(e);
    }
    j.set("buffers", bufs);
    if (rdma) {
        Json devs = Json::array();
        for (const auto &dv : d.devices) {
            Json e = Json::object();
            e.set("gid", dv.gid);
            e.set("lid", static_cast<uint64_t>(dv.lid));
            e.set("name", dv.name);
            if (!dv.link_layer.empty()) e.set("mc_link_layer", dv.link_layer);
            devs.push(e);
        }
        j.set("devices", devs);
        j.set("priority_matrix", d.priority_matrix.is_object() ? d.priority_matrix : Json::object());
    }
    return j;
}

namespace {

[[noreturn]] void bad(const std::string &why) {
    throw Error(kErrMetadata, "unsupported segment descriptor: " + why);
}

std::vector<uint32_t> keys(const Json &e, const char *field, size_t idx) {
    std::vector<uint32_t> out;
    const Json *k = e.find(field);
    if (!k) return out;
    const Json::Array *a = k->get_array();
    if (!a) bad("buffers[" + std::to_string(idx) + "]." + field + " is not an array");
    for (const Json &v : *a) {
        uint64_t x;
        if (!v.get_u64(x) || x > 0xFFFFFFFFull)
            bad("buffers[" + std::to_string(idx) + "]." + field + " holds a non-32-bit key");
        out.push_back(static_cast<uint32_t>(x));
    }
    return out;
}

}  // namespace

namespace {

std::string decode_protocol(const Json &j) {
    const Json *proto = j.find("protocol");
    if (proto && proto->is_array()) {
        // Multi-protocol builds publish an array; take the first we know.
        for (const Json &p : *proto->get_array())
            if (p.is_string()) return *p.get_string();
        return "";
    }
    return json_string_or(j, "protocol", "");
}

DeviceDesc decode_device(const Json &e, size_t i) {
    DeviceDesc dv;
    dv.name = json_string_or(e, "name", "");
    dv.gid = json_string_or(e, "gid", "");
    dv.link_layer = json_string_or(e, "mc_link_layer", "");
    if (dv.link_layer.size() > 32) dv.link_layer.clear();
    uint64_t lid = 0;
    if (const Json *l = e.find("lid")) {
        if (!l->get_u64(lid) || lid > 0xFFFF) lid = 0;
    }
    dv.lid = static_cast<uint32_t>(lid);
    if (dv.name.empty() || dv.gid.empty()) bad("devices[" + std::to_string(i) + "] has an empty name or gid");
    return dv;
}

// Our own keys: the host identity, the process token and the same-host socket.
void decode_host_keys(const Json &j, SegmentDesc &d) {
    d.host_id = json_string_or(j, "mc_host_id", "");
    if (const Json *p = j.find("mc_process")) {
        const std::string *s = p->get_string();
        bool hex = s && !s->empty() && s->size() <= 64;
        for (size_t i = 0; hex && i < s->size(); ++i) hex = std::isxdigit(static_cast<unsigned char>((*s)[i])) != 0;
        if (!hex) bad("'mc_process' is not a short hex string");
        d.process_token = *s;
    }
    if (const Json *p = j.find("mc_same_host")) {
        const std::string *s = p->get_string();
        if (!s || !valid_samehost_socket_name(*s))
            bad("'mc_same_host' is not a socket name of at most 64 characters [A-Za-z0-9._-]");
        d.same_host_socket = *s;
    }
}

BufferDesc decode_buffer(const Json &e, size_t i, const SegmentDesc &d) {
    auto at = [i]() { return "buffers[" + std::to_string(i) + "]"; };
    if (!e.is_object()) bad(at() + " is not an object");
    BufferDesc b;
    b.name = json_string_or(e, "name", "");
    const Json *addr = e.find("addr");
    const Json *len = e.find("length");
    if (b.name.empty()) bad(at() + " has an empty name");
    if (!addr || !addr->get_u64(b.addr) || b.addr == 0) bad(at() + " has no valid non-zero addr");
    if (!len || !len->get_u64(b.length) || b.length == 0) bad(at() + " has no valid non-zero length");
    if (b.addr + b.length < b.addr) bad(at() + " wraps around the address space");
    b.cuda_ipc = json_string_or(e, "mc_cuda_ipc", "");
    if (const Json *o = e.find("mc_cuda_ipc_offset")) o->get_u64(b.cuda_ipc_offset);
    if (const Json *dv = e.find("mc_cuda_device")) {
        int64_t v = -1;
        if (dv->get_i64(v) && v >= 0 && v < 4096) b.cuda_device = static_cast<int>(v);
    }
    b.lkey = keys(e, "lkey", i);
    b.rkey = keys(e, "rkey", i);
    if (!b.rkey.empty()) {
        if (b.rkey.size() != b.lkey.size()) bad(at() + " has rkey/lkey of different sizes");
        if (d.protocol == "rdma" && b.rkey.size() != d.devices.size())
            bad(at() + " has " + std::to_string(b.rkey.size()) + " rkeys for " + std::to_string(d.devices.size()) +
                " devices");
    }
    return b;
}

const Json::Array &array_field(const Json &j, const char *key) {
    const Json::Array *a = j.find(key)->get_array();
    if (!a) bad(std::string("'") + key + "' is not an array");
    return *a;
}

}  // namespace

SegmentDesc decode_segment_desc(const Json &j) {
    if (!j.is_object()) bad(j.is_null() ? "the peer sent null (it has no descriptor yet)"
                                        : "not a JSON object");
    SegmentDesc d;
    d.name = json_string_or(j, "name", "");
    if (d.name.empty()) bad("missing or empty 'name'");
    d.protocol = decode_protocol(j);
    if (d.protocol.empty()) bad("missing 'protocol'");
    d.tcp_data_host = json_string_or(j, "tcp_data_host", "");
    d.rdma_server_name = json_string_or(j, "rdma_server_name", "");
    if (const Json *p = j.find("tcp_data_port")) {
        int64_t v;
        if (!p->get_i64(v) || v < 0 || v > 65535) bad("'tcp_data_port' is not a port number");
        d.tcp_data_port = static_cast<uint16_t>(v);
    }
    if (const Json *p = j.find("tcp_proto_version")) {
        int64_t v;
        if (!p->get_i64(v) || v < 0 || v > 1000) bad("'tcp_proto_version' is not a small integer");
        d.tcp_proto_version = static_cast<int>(v);
    }
    if (j.find("devices")) {
        const Json::Array &a = array_field(j, "devices");
        for (size_t i = 0; i < a.size(); ++i) d.devices.push_back(decode_device(a[i], i));
    }
    if (const Json *pm = j.find("priority_matrix")) d.priority_matrix = *pm;
    decode_host_keys(j, d);
    if (j.find("buffers")) {
        const Json::Array &a = array_field(j, "buffers");
        for (size_t i = 0; i < a.size(); ++i) d.buffers.push_back(decode_buffer(a[i], i, d));
    }
    for (const auto &b : d.buffers) {
        bool gpu = b.cuda_device >= 0 || !b.cuda_ipc.empty() || b.name.compare(0, 5, "cuda:") == 0;
        if (!gpu) d.host_ranges.emplace_back(b.addr, b.addr + b.length);
    }
    std::sort(d.host_ranges.begin(), d.host_ranges.end());
    std::vector<std::pair<uint64_t, uint64_t>> ipc;  // [addr, end): no buffer wraps (checked above)
    for (const auto &b : d.buffers)
        if (!b.cuda_ipc.empty()) ipc.emplace_back(b.addr, b.addr + b.length);
    std::sort(ipc.begin(), ipc.end());
    d.ipc_buffers_overlap = false;
    for (size_t i = 1; i < ipc.size(); ++i)
        if (ipc[i].first < ipc[i - 1].second) d.ipc_buffers_overlap = true;
    return d;
}

bool SegmentDesc::in_host_buffer(uint64_t addr, uint64_t len) const {
    // The last range starting at or below addr.
    auto it = std::upper_bound(host_ranges.begin(), host_ranges.end(),
                               std::make_pair(addr, UINT64_MAX));
    if (it == host_ranges.begin()) return false;
    --it;
    return range_within(addr, len, it->first, it->second - it->first);
}

bool valid_samehost_socket_name(const std::string &name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

}  // namespace mcrs
