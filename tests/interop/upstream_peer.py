#!/usr/bin/env python3
"""The upstream twin of `mooncake-peer`: one upstream Mooncake engine (PyPI
mooncake-transfer-engine-non-cuda 0.3.13.post1, TCP over P2PHANDSHAKE on
127.0.0.1) with one registered buffer, driven by the line protocol described
in src/peer_protocol.rs. Tests run it next to our engine to check
interoperability in both directions.

Usage: upstream_peer.py [--size BYTES] [--seed N] [--metadata CONN --name SEGMENT]
"""
import argparse
import ctypes
import json
import sys

PERIOD = 4093
MASK = (1 << 64) - 1


def pattern_block(seed):
    out = bytearray()
    state = seed
    while len(out) < PERIOD:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out += z.to_bytes(8, "little")
    return bytes(out[:PERIOD])


def pattern(seed, start, length):
    block = pattern_block(seed)
    first = start % PERIOD
    reps = (first + length) // PERIOD + 1
    return (block * reps)[first:first + length]


class Peer:
    def __init__(self, size, seed, metadata="P2PHANDSHAKE", name=None):
        from mooncake.engine import TransferEngine  # imported late: errors go to stdout

        self.te = TransferEngine()
        rc = self.te.initialize(name or "127.0.0.1", metadata, "tcp", "")
        if rc != 0:
            raise RuntimeError("initialize failed: %d" % rc)
        self.size = size
        self.buf = ctypes.create_string_buffer(size)
        self.addr = ctypes.addressof(self.buf)
        ctypes.memmove(self.addr, pattern(seed, 0, size), size)
        rc = self.te.register_memory(self.addr, size)
        if rc != 0:
            raise RuntimeError("register_memory failed: %d" % rc)
        self.segment = name if metadata != "P2PHANDSHAKE" else "127.0.0.1:%d" % self.te.get_rpc_port()

    def transfer(self, write, seg, raddr, loff, block, count, notify=None):
        from mooncake.engine import TransferNotify, TransferOpcode

        if loff < 0 or loff + block * count > self.size:
            return "ERR local range outside the buffer"
        if notify is not None:
            op = TransferOpcode.Write if write else TransferOpcode.Read
            rc = self.te.transfer_sync(seg, self.addr + loff, raddr, block, op,
                                       TransferNotify(notify[0], notify[1]))
        elif count == 1:
            fn = self.te.transfer_sync_write if write else self.te.transfer_sync_read
            rc = fn(seg, self.addr + loff, raddr, block)
        else:
            fn = self.te.batch_transfer_sync_write if write else self.te.batch_transfer_sync_read
            rc = fn(seg, [self.addr + loff + i * block for i in range(count)],
                    [raddr + i * block for i in range(count)], [block] * count)
        return "OK" if rc == 0 else "ERR upstream returned %d" % rc

    def handle(self, line):
        t = line.split()
        verb = t[0]
        if verb in ("read", "write"):
            return self.transfer(verb == "write", t[1], int(t[2]), int(t[3]), int(t[4]), 1)
        if verb in ("readv", "writev"):
            return self.transfer(verb == "writev", t[1], int(t[2]), int(t[3]), int(t[4]), int(t[5]))
        if verb == "write_notify":
            return self.transfer(True, t[1], int(t[2]), int(t[3]), int(t[4]), 1, (t[5], t[6]))
        if verb == "probe":
            rc = self.te.send_probe(t[1])
            return "OK" if rc == 0 else "ERR probe returned %d" % rc
        if verb == "fill":
            off, n, seed = int(t[1]), int(t[2]), int(t[3])
            if off < 0 or off + n > self.size:
                return "ERR range outside the buffer"
            ctypes.memmove(self.addr + off, pattern(seed, off, n), n)
            return "OK"
        if verb == "check":
            off, n, seed, start = int(t[1]), int(t[2]), int(t[3]), int(t[4])
            if off < 0 or off + n > self.size:
                return "ERR range outside the buffer"
            got = ctypes.string_at(self.addr + off, n)
            want = pattern(seed, start, n)
            if got == want:
                return "OK"
            i = next(k for k in range(n) if got[k] != want[k])
            return "ERR mismatch at byte %d (offset %d)" % (i, off + i)
        if verb == "notifs":
            return "OK " + json.dumps([[n.name, n.msg] for n in self.te.get_notifies()])
        return "ERR unknown command %r" % verb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=1)
    # A metadata store (etcd://..., http://...) and the name to publish:
    # upstream advertises MC_TCP_BIND_ADDRESS, which the test sets to
    # 127.0.0.1.
    ap.add_argument("--metadata", default="P2PHANDSHAKE")
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    try:
        peer = Peer(a.size, a.seed, a.metadata, a.name)
    except Exception as e:  # reported on stdout so the test shows the cause
        print("FAILED %s: %s" % (type(e).__name__, e), flush=True)
        return 1
    print("READY " + json.dumps({"segment": peer.segment, "addr": peer.addr, "len": a.size}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if line == "quit":
            break
        try:
            reply = peer.handle(line)
        except Exception as e:
            reply = "ERR %s: %s" % (type(e).__name__, e)
        print(reply.replace("\n", " "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
