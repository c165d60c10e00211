// The segment descriptor: the JSON a segment's owner publishes in
// upstream's format and a peer decodes before it can transfer. Decoding treats the
// JSON as untrusted and rejects what upstream rejects, plus ranges that wrap.
// Every key, published and accepted: docs/wire-protocol.md, Segment descriptor.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/json.h"

namespace mcrs {

struct BufferDesc {
    std::string name;  // location, e.g. "cpu:0"
    uint64_t addr = 0;
    uint64_t length = 0;
    std::vector<uint32_t> lkey;  // RDMA only
    std::vector<uint32_t> rkey;  // RDMA only
    // Extension keys (ignored by upstream readers): the same-host GPU path.
    std::string cuda_ipc;         // "mc_cuda_ipc": IPC handle of the allocation
    uint64_t cuda_ipc_offset = 0;  // "mc_cuda_ipc_offset"
    int cuda_device = -1;          // "mc_cuda_device"
};

struct DeviceDesc {
    std::string name;
    std::string gid;
    uint32_t lid = 0;
    // Extension key "mc_link_layer" ("IB" / "RoCE"; ignored by upstream
    // readers). Empty = not published; peers then infer it from lid and gid
    // (transport/rdma/link_layer.h).
    std::string link_layer;
};

struct SegmentDesc {
    std::string name;
    std::string protocol;  // "tcp", "rdma", ...
    std::string tcp_data_host;
    uint16_t tcp_data_port = 0;
    int tcp_proto_version = 1;
    std::string rdma_server_name;
    std::vector<BufferDesc> buffers;
    std::vector<DeviceDesc> devices;
    Json priority_matrix;  // kept verbatim (RDMA)
    // Extension keys: which host owns the segment, and an opaque random
    // token per process (CUDA IPC must not open its own handles); neither
    // reveals a pid.
    std::string host_id;        // "mc_host_id"
    std::string process_token;  // "mc_process": 32 hex digits
    // "mc_same_host": the abstract Unix socket name of the owner's
    // same-host transport (transport/samehost); empty = not offered.
    std::string same_host_socket;
    // Derived when decoding: the host-memory buffers, sorted by address,
    // as [addr, end) pairs (what the same-host path may target).
    std::vector<std::pair<uint64_t, uint64_t>> host_ranges;
    // Derived when decoding: whether two buffers with a CUDA IPC handle
    // overlap (then only a scan finds the first one holding a range).
    bool ipc_buffers_overlap = true;

    // True when [addr, addr+len) lies inside one host-memory buffer.
    bool in_host_buffer(uint64_t addr, uint64_t len) const;
};

Json encode_segment_desc(const SegmentDesc &d);
// Throws Error(kErrMetadata) naming the offending field.
SegmentDesc decode_segment_desc(const Json &j);

// True when `name` is a well-formed same-host socket name, the only form
// `mc_same_host` may take: printable [A-Za-z0-9._-], 1..64 characters.
bool valid_samehost_socket_name(const std::string &name);

// Local time "YYYY-MM-DD HH:MM:SS.uuuuuu", as upstream writes `timestamp`.
std::string descriptor_timestamp();

}  // namespace mcrs
