#!/usr/bin/env python3
"""A stand-in for a vLLM MooncakeConnector worker, for interop tests: the
side channel is pyzmq (ROUTER/DEALER) with msgspec structs whose field names
and defaults follow vLLM's MooncakeXferMetadata / MooncakeXferResponse
(generation 3), and the data plane is the upstream Mooncake engine
(mooncake-transfer-engine-non-cuda 0.3.13, TCP, P2PHANDSHAKE on 127.0.0.1).
The KV cache follows mooncake_connector::sim::model (same bytes, same
head-major block layout), so both sides can verify what arrived.

  vllm_side_peer.py decoder --bootstrap URL --engine-id ID --transfer-id T
                    --prompt TEXT --blocks 1,2,3 [geometry flags]
      pulls one request from a prefill engine and verifies it.
  vllm_side_peer.py prefill --bootstrap URL --engine-id ID --transfer-id T
                    --prompt TEXT --blocks 1,2,3 [geometry flags]
      registers as prefill rank 0, fills its KV, serves one pull.
Prints one JSON line with the outcome.
"""
import argparse
import ctypes
import json
import sys
import urllib.request

import msgspec
import zmq

MASK = (1 << 64) - 1


class MooncakeXferMetadata(msgspec.Struct, omit_defaults=True):
    remote_hostname: str
    remote_port: int
    remote_tp_size: int
    remote_tp_rank: int
    req_blocks: dict[str, tuple[str, list[list[int]]]]
    kv_caches_base_addr: list[int]
    block_lens: list[int]
    kv_block_lens: list[int]
    registered_layer_names: list[str] = msgspec.field(default_factory=list)
    registered_layer_indices: list[int] = msgspec.field(default_factory=list)
    registered_group_indices: list[int] = msgspec.field(default_factory=list)
    remote_pp_size: int = 1


class MooncakeXferResponse(msgspec.Struct, omit_defaults=True):
    status: int
    ok_reqs: list[str] | None = None
    err_reqs: list[str] | None = None
    err_msg: str | None = None


FINISH, CONTINUE, ERROR = 0, 1, 2


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def head_kv(layer, pos, token, head, kv, size):
    key = splitmix64(((layer << 48) ^ (pos << 16) ^ ((token * 0x100000001B3) & MASK) ^ (head << 8) ^ kv) & MASK)
    out = bytearray()
    i = 0
    while len(out) < size:
        out += splitmix64(key ^ i).to_bytes(8, "little")
        i += 1
    return bytes(out[:size])


class Geometry:
    def __init__(self, a):
        self.layers, self.heads, self.head_size = a.layers, a.heads, a.head_size
        self.block_size, self.num_blocks = a.block_size, a.num_blocks
        self.block_len = self.heads * 2 * self.block_size * self.head_size  # TP 1

    def region_bytes(self):
        return self.num_blocks * self.block_len

    def fill_block(self, layer, tokens, block_index):
        bs, hs = self.block_size, self.head_size
        out = bytearray(self.block_len)
        for slot in range(bs):
            pos = block_index * bs + slot
            if pos >= len(tokens):
                break
            for h in range(self.heads):
                for kv in range(2):
                    off = ((h * 2 + kv) * bs + slot) * hs
                    out[off:off + hs] = head_kv(layer, pos, tokens[pos], h, kv, hs)
        return bytes(out)


class KvCache:
    def __init__(self, geo):
        from mooncake.engine import TransferEngine

        self.geo = geo
        self.te = TransferEngine()
        if self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("upstream initialize failed")
        size = geo.layers * geo.region_bytes()
        self.buf = ctypes.create_string_buffer(size)
        self.base = ctypes.addressof(self.buf)
        if self.te.register_memory(self.base, size) != 0:
            raise RuntimeError("register_memory failed")
        self.rpc_port = self.te.get_rpc_port()

    def block_addr(self, layer, block):
        return self.base + layer * self.geo.region_bytes() + block * self.geo.block_len


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def run_decoder(a, geo):
    kv = KvCache(geo)
    tokens = list(a.prompt.encode())
    blocks = [int(b) for b in a.blocks.split(",")]
    table = http("GET", a.bootstrap.rstrip("/") + "/query")
    entry = next(e for e in table.values() if e["engine_id"] == a.engine_id)
    addr = entry["worker_addr"]["0"]["0"]
    meta = MooncakeXferMetadata(
        remote_hostname="127.0.0.1",
        remote_port=kv.rpc_port,
        remote_tp_size=1,
        remote_tp_rank=0,
        req_blocks={"vllm-req-1": (a.transfer_id, [blocks])},
        kv_caches_base_addr=[kv.base + l * geo.region_bytes() for l in range(geo.layers)],
        block_lens=[geo.block_len] * geo.layers,
        kv_block_lens=[geo.block_len] * geo.layers,
        registered_layer_names=["model.layers.%d.self_attn.attn" % l for l in range(geo.layers)],
        registered_layer_indices=list(range(geo.layers)),
        registered_group_indices=[0] * geo.layers,
    )
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.RCVTIMEO = 20000
    sock.connect(addr)
    sock.send(msgspec.msgpack.encode(meta))
    replies = []
    while True:
        frames = sock.recv_multipart()
        r = msgspec.msgpack.decode(frames[-1], type=MooncakeXferResponse)
        replies.append({"status": r.status, "ok": r.ok_reqs, "err": r.err_reqs, "msg": r.err_msg})
        if r.status != CONTINUE:
            break
    ok = any(x["ok"] and "vllm-req-1" in x["ok"] for x in replies)
    bad = None
    if ok:
        limit = len(tokens) - 1
        for layer in range(geo.layers):
            for i, b in enumerate(blocks):
                want = geo.fill_block(layer, tokens, i)
                got = ctypes.string_at(kv.block_addr(layer, b), geo.block_len)
                # Positions past limit (the last prompt token) are not checked.
                for slot in range(geo.block_size):
                    pos = i * geo.block_size + slot
                    if pos >= limit:
                        break
                    for h in range(geo.heads):
                        for kvi in range(2):
                            off = ((h * 2 + kvi) * geo.block_size + slot) * geo.head_size
                            if got[off:off + geo.head_size] != want[off:off + geo.head_size]:
                                bad = bad or "layer %d pos %d head %d" % (layer, pos, h)
    print(json.dumps({"ok": ok, "verified": ok and bad is None, "mismatch": bad, "replies": replies}), flush=True)


def run_prefill(a, geo):
    kv = KvCache(geo)
    tokens = list(a.prompt.encode())
    blocks = [int(b) for b in a.blocks.split(",")]
    for layer in range(geo.layers):
        for i, b in enumerate(blocks):
            ctypes.memmove(kv.block_addr(layer, b), geo.fill_block(layer, tokens, i), geo.block_len)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    addr = "tcp://127.0.0.1:%d" % port
    http("POST", a.bootstrap.rstrip("/") + "/register",
         {"engine_id": a.engine_id, "dp_rank": 0, "tp_rank": 0, "pp_rank": 0, "addr": addr})
    print(json.dumps({"ready": addr}), flush=True)
    sock.RCVTIMEO = 30000
    ident, payload = sock.recv_multipart()
    meta = msgspec.msgpack.decode(payload, type=MooncakeXferMetadata)
    session = "%s:%d" % (meta.remote_hostname, meta.remote_port)
    d_req_id, (transfer_id, groups) = next(iter(meta.req_blocks.items()))
    dst_blocks = groups[0]
    src, dst, lens = [], [], []
    for layer in range(geo.layers):
        for s, d in zip(blocks[-len(dst_blocks):], dst_blocks):
            src.append(kv.block_addr(layer, s))
            dst.append(meta.kv_caches_base_addr[layer] + d * meta.block_lens[layer])
            lens.append(meta.kv_block_lens[layer])
    rc = kv.te.batch_transfer_sync_write(session, src, dst, lens)
    if rc == 0 and transfer_id == a.transfer_id:
        resp = MooncakeXferResponse(status=FINISH, ok_reqs=[d_req_id])
    else:
        resp = MooncakeXferResponse(status=FINISH, err_reqs=[d_req_id], err_msg="Mooncake transfer engine returned %d" % rc)
    sock.send_multipart([ident, msgspec.msgpack.encode(resp)])
    print(json.dumps({"rc": rc, "descriptors": len(src), "transfer_id": transfer_id,
                      "names": meta.registered_layer_names, "tp": [meta.remote_tp_size, meta.remote_tp_rank]}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["decoder", "prefill"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--engine-id", required=True)
    ap.add_argument("--transfer-id", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--blocks", required=True)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-size", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--num-blocks", type=int, default=64)
    a = ap.parse_args()
    geo = Geometry(a)
    (run_decoder if a.mode == "decoder" else run_prefill)(a, geo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
