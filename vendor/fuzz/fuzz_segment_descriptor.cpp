// The segment descriptor decoder on the JSON text a peer publishes (the
// metadata reply): it either throws mcrs::Error or yields a descriptor
// whose ranges do not wrap, which re-encodes and decodes to the same
// fields, and whose host-buffer lookups are consistent.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/error.h"
#include "common/json.h"
#include "core/segment_descriptor.h"
#include "fuzz_check.h"

using namespace mcrs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    SegmentDesc d;
    try {
        d = decode_segment_desc(Json::parse(text));
    } catch (const Error &) {
        return 0;
    }
    FUZZ_CHECK(!d.name.empty() && !d.protocol.empty(), "accepted without name/protocol");
    for (const BufferDesc &b : d.buffers) {
        FUZZ_CHECK(b.addr != 0 && b.length != 0, "zero addr or length accepted");
        FUZZ_CHECK(b.addr + b.length >= b.addr, "wrapping range accepted");
        FUZZ_CHECK(b.rkey.empty() || b.rkey.size() == b.lkey.size(), "rkey/lkey sizes");
    }
    for (size_t i = 1; i < d.host_ranges.size(); ++i)
        FUZZ_CHECK(d.host_ranges[i - 1] <= d.host_ranges[i], "host ranges unsorted");
    for (const auto &r : d.host_ranges) {
        uint64_t len = r.second - r.first;
        FUZZ_CHECK(d.in_host_buffer(r.first, len), "a host buffer is not inside itself");
        FUZZ_CHECK(!d.in_host_buffer(r.first, 0), "empty range accepted");
        FUZZ_CHECK(!d.in_host_buffer(r.second, UINT64_MAX), "wrapping lookup accepted");
    }
    SegmentDesc e;
    try {
        e = decode_segment_desc(Json::parse(encode_segment_desc(d).dump()));
    } catch (const Error &err) {
        FUZZ_CHECK(false, err.what());
    }
    FUZZ_CHECK(e.name == d.name && e.protocol == d.protocol, "name/protocol round trip");
    FUZZ_CHECK(e.tcp_data_host == d.tcp_data_host && e.tcp_data_port == d.tcp_data_port &&
                   e.tcp_proto_version == d.tcp_proto_version,
               "tcp fields round trip");
    FUZZ_CHECK(e.host_id == d.host_id && e.process_token == d.process_token &&
                   e.same_host_socket == d.same_host_socket,
               "owner fields round trip");
    FUZZ_CHECK(e.buffers.size() == d.buffers.size(), "buffer count round trip");
    for (size_t i = 0; i < d.buffers.size(); ++i) {
        const BufferDesc &a = d.buffers[i], &b = e.buffers[i];
        FUZZ_CHECK(a.name == b.name && a.addr == b.addr && a.length == b.length,
                   "buffer round trip");
        if (d.protocol != "tcp") FUZZ_CHECK(a.lkey == b.lkey && a.rkey == b.rkey, "keys round trip");
    }
    if (d.protocol != "tcp") {
        FUZZ_CHECK(e.devices.size() == d.devices.size(), "device count round trip");
        for (size_t i = 0; i < d.devices.size(); ++i)
            FUZZ_CHECK(e.devices[i].name == d.devices[i].name &&
                           e.devices[i].gid == d.devices[i].gid &&
                           e.devices[i].lid == d.devices[i].lid &&
                           e.devices[i].link_layer == d.devices[i].link_layer,
                       "device round trip");
    }
    return 0;
}
