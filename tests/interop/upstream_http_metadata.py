#!/usr/bin/env python3
"""Upstream Mooncake engines (PyPI mooncake-transfer-engine-non-cuda
0.3.13.post1, TCP) using an HTTP metadata server, for
tests/metadata_server.rs.

Usage:
  upstream_http_metadata.py pair URL PORT_A PORT_B
      two engines (127.0.0.1:PORT_A, 127.0.0.1:PORT_B) publish through URL;
      B reads A's 1 MiB buffer; prints "OK" when the bytes match.
  upstream_http_metadata.py init URL PORT crash|clean
      one engine publishes as 127.0.0.1:PORT and prints "rc N" (its
      initialize result); with crash it then exits at once, leaving its
      keys behind, as a crashed engine does.
"""
import ctypes
import os
import sys


def main():
    from mooncake.engine import TransferEngine

    mode, url = sys.argv[1], sys.argv[2]
    if mode == "pair":
        a, b = TransferEngine(), TransferEngine()
        name_a = "127.0.0.1:" + sys.argv[3]
        for te, name in ((a, name_a), (b, "127.0.0.1:" + sys.argv[4])):
            rc = te.initialize(name, url, "tcp", "")
            if rc != 0:
                print("ERR initialize %s: %d" % (name, rc), flush=True)
                return 1
        n = 1 << 20
        src = ctypes.create_string_buffer(bytes(range(256)) * (n // 256), n)
        dst = ctypes.create_string_buffer(n)
        if a.register_memory(ctypes.addressof(src), n) or b.register_memory(ctypes.addressof(dst), n):
            print("ERR register_memory", flush=True)
            return 1
        rc = b.transfer_sync_read(name_a, ctypes.addressof(dst), ctypes.addressof(src), n)
        if rc != 0 or dst.raw != src.raw:
            print("ERR read rc %d, match %s" % (rc, dst.raw == src.raw), flush=True)
            return 1
        a.unregister_memory(ctypes.addressof(src))
        b.unregister_memory(ctypes.addressof(dst))
        print("OK", flush=True)
        return 0
    if mode == "init":
        te = TransferEngine()
        rc = te.initialize("127.0.0.1:" + sys.argv[3], url, "tcp", "")
        print("rc %d" % rc, flush=True)
        if sys.argv[4] == "crash":
            os._exit(0)
        return 0
    print("ERR unknown mode " + mode, flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
