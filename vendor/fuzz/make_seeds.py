#!/usr/bin/env python3
"""Writes the hand-made seed inputs into corpus/<target>/seed-*.

Valid messages as the engine and upstream peers send them, plus a few
near-misses. Run from anywhere; existing seed-* files are replaced, the
minimized corpus files (named by their SHA-1) are left alone.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
# Must match fuzz_engine.h.
BASE = 0x3F0000000000
REMOTE = BASE + 0x1000
REMOTE_LEN = 64 * 1024
LOCAL = BASE + 0x12000
MAGIC = 0x4D435456


def j(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def frame(t, body, typed=True):
    payload = (bytes([t]) if typed else b"") + body
    return struct.pack("<Q", len(payload)) + payload


def hdr(size, addr, op):
    return struct.pack("<QQB7x", size, addr, op)


def status(code):
    return struct.pack("<Q", (MAGIC << 32) | code)


TCP_DESC = {
    "name": "127.0.0.1:15001", "protocol": "tcp", "tcp_data_port": 15002,
    "tcp_proto_version": 2, "rdma_server_name": "", "timestamp": "2026-01-01 00:00:00.000000",
    "mc_host_id": "0123456789abcdef", "mc_process": "0123456789abcdef0123456789abcdef",
    "mc_same_host": "mooncake-00112233445566778899aabbccddeeff",
    "buffers": [{"addr": 140000000000000, "length": 1048576, "name": "cpu:0"},
                {"addr": 140000002000000, "length": 4096, "name": "cpu:1"}],
}
RDMA_DESC = {
    "name": "10.0.0.1:15001", "protocol": "rdma", "tcp_data_port": 15002,
    "tcp_proto_version": 2, "rdma_server_name": "10.0.0.1:15001",
    "timestamp": "2026-01-01 00:00:00.000000",
    "buffers": [{"addr": 140000000000000, "length": 1048576, "name": "cpu:0",
                 "lkey": [1234, 5678], "rkey": [4321, 8765]},
                {"addr": 140000004000000, "length": 2097152, "name": "cuda:0",
                 "lkey": [11, 12], "rkey": [21, 22], "mc_cuda_ipc": "AAECAwQF",
                 "mc_cuda_ipc_offset": 4096, "mc_cuda_device": 0}],
    "devices": [{"gid": "fe80:0000:0000:0000:0202:c9ff:fe00:0001", "lid": 0, "name": "mlx5_0",
                 "mc_link_layer": "RoCE"},
                {"gid": "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01", "lid": 7,
                 "name": "mlx5_1"}],
    "priority_matrix": {"cpu:0": [["mlx5_0"], ["mlx5_1"]]},
}
UPSTREAM_DESC = {  # what an upstream TCP engine publishes: protocol as an array
    "name": "node-a:12001", "protocol": ["tcp"], "tcp_data_port": 12002,
    "buffers": [{"addr": 94000000000000, "length": 65536, "name": "cpu:0"}],
}
HS_REQ = {"local_nic_path": "127.0.0.1:17002@mlx5_0", "peer_nic_path": "127.0.0.1:17001@mlx5_1",
          "local_gid": "fe80:0000:0000:0000:0202:c9ff:fe00:0001", "local_lid": 0,
          "payload": "", "qp_num": [17, 18], "reply_msg": "", "ready_ack": False}
HS_REPLY = dict(HS_REQ, local_nic_path="127.0.0.1:17001@mlx5_1",
                peer_nic_path="127.0.0.1:17002@mlx5_0", qp_num=[33, 34])
HS_REPLY.pop("ready_ack")
HS_ACK = dict(HS_REQ, ready_ack=True)
HS_EMPTY = {"local_gid": "", "local_lid": 0, "local_nic_path": "", "payload": "",
            "peer_nic_path": "", "qp_num": [], "reply_msg": ""}
HS_REJECT = dict(HS_EMPTY, reply_msg="QP count mismatch")
HS_NOTIFY = dict(HS_REQ, notify_qp_num=99, notify_rq_depth=64, ctrl_channel=True)
NOTIFY = {"name": "kv-ready", "notify_msg": "layer 3 done"}

json_docs = [TCP_DESC, RDMA_DESC, UPSTREAM_DESC, HS_REQ, HS_REPLY, HS_ACK, HS_EMPTY, NOTIFY, {},
             [], {"status": "success"}]
json_text = [j(d) for d in json_docs] + [
    ' { "a" : [ 1 , -2 , 3.5e10 , true , false , null ] } \n',
    '[18446744073709551615,18446744073709551616,-9223372036854775808,-0.0,1e400]',
    '"\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/"',
    "[" * 64 + "]" * 64,
    "[" * 66 + "]" * 66,
    '{"a":{"b":{"c":[{"d":"e"}]}}}',
]

seeds = {
    "json": json_text,
    "segment_descriptor": [j(TCP_DESC), j(RDMA_DESC), j(UPSTREAM_DESC),
                           j(dict(TCP_DESC, buffers=[{"addr": 2**64 - 4096, "length": 4096,
                                                      "name": "cpu:0"}])),
                           j(dict(RDMA_DESC, devices=RDMA_DESC["devices"][:1])), "null"],
    "rdma_handshake": [j(HS_REQ), j(HS_REPLY), j(HS_ACK), j(HS_EMPTY), j(HS_REJECT), j(HS_NOTIFY),
                       j(dict(HS_REQ, qp_num=list(range(256)))),
                       j(dict(HS_REQ, qp_num=[17, 2**24])), j(dict(HS_REQ, local_gid="zz"))],
    "tcp_status": [status(0), status(1) + status(0), status(2) + status(3) + status(7),
                   b"\x00" * 8, struct.pack("<Q", MAGIC)],
}


def sh_req(op, target, length, initiator):
    return struct.pack("<B7xQQQ", op, target, length, initiator)


def sh_status(code):
    return struct.pack("<Q", (0x4D435348 << 32) | code)


seeds["samehost_wire"] = [
    sh_req(0, 0x7F0000001000, 4096, 0x7F1000002000),            # READ
    sh_req(1, 0x7F0000001000, 1 << 20, 0x7F1000002000),         # WRITE
    sh_req(0, 0x1000, 1, 0x2000) + sh_req(1, 0x1000, 8, 0x3000),  # pipelined
    sh_status(0) + sh_status(1) + sh_status(2),
    sh_req(0, 2**64 - 16, 32, 0x1000),                          # wraps
    sh_req(7, 0x1000, 8, 0x2000),                               # unknown opcode
]
frames = [frame(1, b"{}\n"), frame(0, j(HS_REQ).encode()), frame(2, j(NOTIFY).encode()),
          frame(3, b"{}"), frame(0, j(HS_REQ).encode(), typed=False),
          frame(1, b"{\"a\":"), frame(7, b"{}"), struct.pack("<Q", 0),
          struct.pack("<Q", 1 << 40) + b"\x01{}", frame(1, b"{}") + frame(3, b"{}")]
seeds["handshake_frame"] = frames
seeds["handshake_server_stream"] = frames
seeds["tcp_server_stream"] = [
    hdr(16, REMOTE, 0x80),                                   # v2 READ
    hdr(16, REMOTE + 100, 0x81) + bytes(range(16)),           # v2 WRITE
    hdr(8, REMOTE, 0x00) + hdr(8, REMOTE + 8, 0x01) + b"12345678",  # v1 READ + WRITE
    b"".join(hdr(64, REMOTE + 64 * i, 0x80 | (i & 1)) + (bytes(64) if i & 1 else b"")
             for i in range(16)),                            # pipelined
    hdr(REMOTE_LEN, REMOTE, 0x80),                            # whole buffer
    hdr(16, REMOTE + REMOTE_LEN - 8, 0x80),                   # crosses the end
    hdr(16, REMOTE + REMOTE_LEN - 8, 0x81) + bytes(16),       # WRITE crossing the end
    hdr(16, REMOTE - 8, 0x81) + bytes(16),                    # WRITE before the start
    hdr(16, LOCAL, 0x80),                                     # local-only buffer
    hdr(16, LOCAL, 0x81) + bytes(16),
    hdr(2**64 - 1, REMOTE, 0x81),                             # wrapping size
    hdr(0, REMOTE, 0x80),                                     # empty
    hdr(16, REMOTE, 0x81) + b"short",                         # truncated payload
    hdr(16, REMOTE, 0xC0) + struct.pack("<QQ", 1, REMOTE),    # same-host HELLO (not served)
    hdr(16, REMOTE, 0x80)[:10],                               # truncated header
]

# Metadata-store answers (metadata/http_client.cpp, redis_store.cpp).
seeds["http_response"] = [
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "HTTP/1.1 404 Not Found\r\nContent-Length: 18\r\n\r\nmetadata not found",
    "HTTP/1.1 400 Bad Request\r\nContent-Length: 34\r\n\r\nDuplicate rpc_meta key not allowed",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\nX-T: 1\r\n\r\n",
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
    "HTTP/1.0 200 OK\r\n\r\nbody to EOF",
    "HTTP/1.1 200 OK\r\nGrpc-Metadata-Content-Type: application/grpc\r\nContent-Length: 80\r\n\r\n"
    '{"header":{"revision":"5"},"kvs":[{"key":"bW9vbmNha2U=","value":"e30K"}],"count":"1"}'[:80],
    "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    "garbage\r\n\r\n",
]
seeds["resp_reply"] = [
    "+OK\r\n",
    "-WRONGPASS invalid username-password pair\r\n",
    ":1\r\n",
    "$2\r\n{}\r\n",
    "$-1\r\n",
    "*2\r\n$3\r\nfoo\r\n:7\r\n",
    "*1\r\n*1\r\n*1\r\n+deep\r\n",
    "$99999999999\r\n",
    "*-1\r\n",
    "?what\r\n",
]

for target, items in seeds.items():
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    for i, item in enumerate(items):
        data = item.encode() if isinstance(item, str) else item
        with open(os.path.join(d, "seed-%02d" % i), "wb") as fh:
            fh.write(data)
