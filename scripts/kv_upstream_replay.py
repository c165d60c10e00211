#!/usr/bin/env python3
"""Replays KV descriptor lists dumped by kv_bench through the upstream
Mooncake engine (the PyPI wheel mooncake-transfer-engine-non-cuda
0.3.13.post1), over TCP on 127.0.0.1, and prints one JSON line per dump.

    .venv-upstream/bin/python scripts/kv_upstream_replay.py DUMP.json [DUMP.json ...]
        [--op read|write] [--runs N] [--timeout S] [--samples K]
        [--env NAME=VALUE ...] [--retry-env NAME=VALUE ...]

A dump is what `kv_bench --dump-descriptors DIR` writes, one file per case:

    {"layout": "llama8b", "tokens": 8192, "pattern": "scattered",
     "src_bytes": <one prefill rank's KV buffer>, "dst_bytes": <decode KV buffer>,
     "ranks": [{"descriptors": [[src_off, dst_off, len], ...]}, ...]}

For each dump this process (the supervisor) starts the engines as child
processes, each its own upstream TransferEngine on 127.0.0.1 (metadata
P2PHANDSHAKE, protocol tcp), and then times --runs runs (default 5; median
kept) after one untimed warm-up batch per rank (segment lookup, data
connections):

  --op read (default): one target process per prefill rank maps, fills
  (per-rank pattern) and registers a src_bytes buffer, like a prefill
  worker; two ranks (llama8b-tp2to1) are two target processes. The
  initiator (the decode worker) registers a dst_bytes buffer and per run
  calls batch_transfer_sync_read(target, dst addrs, src addrs, lengths)
  once per rank with that rank's whole list, one batch per request.
  --op write: one target process registers the dst_bytes buffer (the
  decode worker); the initiator process holds one engine and filled
  src_bytes buffer per rank (the prefill workers) and per run each calls
  batch_transfer_sync_write(target, src addrs, dst addrs, lengths) with its
  list: the direction our connector moves KV, and the call of the
  connector shipped in upstream's wheel.

With several ranks the per-rank calls run in parallel threads (the binding
releases the GIL while a batch runs), as prefill and decode workers run
concurrently.

Every run is checked: before it, sampled windows of the destination (the
start, middle and end of --samples descriptors per rank, first and last
included) are zeroed; after it they must hold the source pattern bytes of
their descriptor (with --op write they are zeroed and read back through
the engine, untimed).

Output, one line per dump, with the keys of `kv_bench --json`:

    {"layout": ..., "tokens": ..., "pattern": ..., "path": "upstream-tcp",
     "descriptors": <all ranks>, "bytes": <all ranks>, "ms": <median>, "gbps": <GB/s, 1e9>,
     "upstream_op": "read" or "write"}

A case that fails (non-zero return code, wrong bytes, an engine that does not
start, more than --timeout seconds (default 120) for the whole case) gives
"ms": null, "gbps": null and an "error" string instead of stopping the
remaining dumps.

Upstream's engines run with their default settings unless --env NAME=VALUE
says otherwise; the line then carries "upstream_env": "NAME=VALUE ...". With
its defaults the wheel's TCP transport admits about 2048 requests per peer
at a time (MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER and
MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER, 1024 each; observed: a batch of
2048 descriptors completes, most larger ones fail at once with "queue-full"
rejections), so every scattered list of a long prompt fails there.
--retry-env NAME=VALUE replays such a failed case once more with those
settings added and prints that line too, e.g.
    --retry-env MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER=65535
    --retry-env MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER=65535
    --retry-env MC_TCP_ADMISSION_TIMEOUT_MS=600000
(65535 is the largest value the wheel accepts for the two limits).

Every process this script starts is killed (by its PID) when the case
ends, and dies with the supervisor. KV_REPLAY_LOGS=DIR keeps the engines'
logs of the last case in DIR.

Memory: the source buffers are filled (resident), the destination is mapped
with MAP_NORESERVE and only the bytes written become resident; llama8b at
32k tokens scattered is about 4 GiB source and 4 of its 8 GiB destination.

    .venv-upstream/bin/python scripts/kv_upstream_replay.py --op write --runs 3 /tmp/kvdump/*.json
"""
import argparse
import ctypes
import json
import mmap
import os
import random
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# The source pattern repeats with a period that no power-of-two block size
# divides, so a block read from the wrong offset is detected.
PERIOD = (1 << 20) + 4093
WINDOW = 4096
MAX_BUFFER = 1 << 40
ENGINE_ENV = {
    # The wheel installs RDMA whenever it finds an HCA; this comparison is TCP.
    "MC_FORCE_TCP": "1",
    "GLOG_minloglevel": "1",
}


def pattern(rank):
    return random.Random(0x4B56 + rank).randbytes(PERIOD) * 2


def expected(pat, src_off, n):
    s = src_off % PERIOD
    return pat[s:s + n]


def map_buffer(size, noreserve):
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if noreserve:
        flags |= getattr(mmap, "MAP_NORESERVE", 0x4000)
    mm = mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, ctypes.addressof(ctypes.c_char.from_buffer(mm))


def die_with_parent():
    """Child side of Popen: SIGKILL when the supervisor goes away."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def new_engine():
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize returned {rc}")
    return engine


# ---------------------------------------------------------------- target side

def fill(mm, size, rank):
    pat = pattern(rank)[:PERIOD]
    for off in range(0, size, PERIOD):
        n = min(PERIOD, size - off)
        mm[off:off + n] = pat[:n]


def serve(args):
    """A passive engine with one registered buffer: a prefill rank's KV cache
    (filled) for --op read, the decode KV cache (--rank -1: not filled) for
    --op write."""
    engine = new_engine()
    mm, base = map_buffer(args.bytes, noreserve=args.rank < 0)
    if args.rank >= 0:
        fill(mm, args.bytes, args.rank)
    rc = engine.register_memory(base, args.bytes)
    if rc != 0:
        raise RuntimeError(f"register_memory({args.bytes} bytes) returned {rc}")
    session = f"127.0.0.1:{engine.get_rpc_port()}"
    print(json.dumps({"session": session, "base": base}), flush=True)
    # Serve until the supervisor closes our stdin (or kills us).
    sys.stdin.buffer.read()
    os._exit(0)


# ------------------------------------------------------------- initiator side

def samples_of(descs, k):
    if len(descs) <= k:
        return list(range(len(descs)))
    step = (len(descs) - 1) / (k - 1)
    return sorted({round(i * step) for i in range(k)})


def windows(desc):
    """(offset in descriptor, length) of the checked windows of one descriptor."""
    _, _, n = desc
    w = min(WINDOW, n)
    return sorted({(0, w), ((n - w) // 2, w), (n - w, w)})


def call_all(plans, sl, fn_name):
    """One batch call per rank (in parallel threads when there are several:
    the pybind calls release the GIL, so the batches overlap)."""
    out = {}

    def call(plan):
        try:
            out[plan["rank"]] = getattr(plan["engine"], fn_name)(
                plan["session"], plan["local"][sl], plan["remote"][sl], plan["len"][sl])
        except Exception as e:  # noqa: BLE001 - reported as the case's error
            out[plan["rank"]] = f"{type(e).__name__}: {e}"

    if len(plans) == 1:
        call(plans[0])
    else:
        threads = [threading.Thread(target=call, args=(p,)) for p in plans]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    for p in plans:
        if out.get(p["rank"]) != 0:
            raise RuntimeError(f"{fn_name} (rank {p['rank']}, {len(p['len'][sl])} descriptors) "
                               f"returned {out.get(p['rank'])}")


def initiate(args):
    """--op read: one engine (the decode worker) pulls each rank's list from
    that rank's target. --op write: one engine per rank (the prefill
    workers, in this process) pushes its list into the decode target."""
    dump = load_dump(args.dump)
    targets = json.loads(args.targets)
    ranks = dump["ranks"]
    plans = []
    if args.op == "read":
        engine = new_engine()
        dst_mm, dst_base = map_buffer(dump["dst_bytes"], noreserve=True)
        rc = engine.register_memory(dst_base, dump["dst_bytes"])
        if rc != 0:
            raise RuntimeError(f"register_memory({dump['dst_bytes']} bytes) returned {rc}")
        for rank, (r, t) in enumerate(zip(ranks, targets)):
            descs = r["descriptors"]
            plans.append({"rank": rank, "engine": engine, "session": t["session"], "descs": descs,
                          "local": [dst_base + d for _, d, _ in descs],
                          "remote": [t["base"] + s for s, _, _ in descs]})
    else:
        target = targets[0]
        dst_base = target["base"]
        for rank, r in enumerate(ranks):
            engine = new_engine()
            mm, src_base = map_buffer(dump["src_bytes"], noreserve=False)
            fill(mm, dump["src_bytes"], rank)
            rc = engine.register_memory(src_base, dump["src_bytes"])
            if rc != 0:
                raise RuntimeError(f"register_memory({dump['src_bytes']} bytes) returned {rc}")
            descs = r["descriptors"]
            plans.append({"rank": rank, "engine": engine, "session": target["session"], "descs": descs,
                          "local": [src_base + s for s, _, _ in descs],
                          "remote": [dst_base + d for _, d, _ in descs], "mm": mm})
    checks = []  # (rank, src_off + window offset, dst_off + window offset, length)
    for p in plans:
        p["len"] = [n for _, _, n in p["descs"]]
        for i in samples_of(p["descs"], args.samples):
            s, d, _ = p["descs"][i]
            checks += [(p["rank"], s + o, d + o, n) for o, n in windows(p["descs"][i])]
    pats = {p["rank"]: pattern(p["rank"]) for p in plans}

    if args.op == "read":
        def clear():
            for _, _, d, n in checks:
                ctypes.memset(dst_base + d, 0, n)

        def check():
            return [c for c in checks if dst_mm[c[2]:c[2] + c[3]] != expected(pats[c[0]], c[1], c[3])]
    else:
        # The destination is in the target process: windows are zeroed and
        # read back through the engine (untimed), from a scratch buffer.
        total = sum(c[3] for c in checks)
        scratch_mm, scratch = map_buffer(total, noreserve=False)
        first = plans[0]["engine"]
        if first.register_memory(scratch, total) != 0:
            raise RuntimeError("register_memory(scratch) returned non-zero")
        offs = [0]
        for c in checks[:-1]:
            offs.append(offs[-1] + c[3])
        io = {"rank": -1, "engine": first, "session": plans[0]["session"],
              "local": [scratch + o for o in offs], "remote": [dst_base + c[2] for c in checks],
              "len": [c[3] for c in checks]}

        def clear():
            ctypes.memset(scratch, 0, total)
            call_all([io], slice(None), "batch_transfer_sync_write")

        def check():
            ctypes.memset(scratch, 0xA5, total)
            call_all([io], slice(None), "batch_transfer_sync_read")
            return [c for c, o in zip(checks, offs)
                    if scratch_mm[o:o + c[3]] != expected(pats[c[0]], c[1], c[3])]

    fn = f"batch_transfer_sync_{args.op}"
    call_all(plans, slice(0, 64), fn)  # warm-up: segment lookup and data connections
    times = []
    for run in range(args.runs):
        clear()
        t0 = time.perf_counter()
        call_all(plans, slice(None), fn)
        ms = (time.perf_counter() - t0) * 1e3
        bad = check()
        if bad:
            r, s, d, n = bad[0]
            raise RuntimeError(f"verification failed: {len(bad)} of {len(checks)} checked windows differ, "
                               f"e.g. rank {r} src_off={s} dst_off={d} len={n} (run {run + 1})")
        times.append(ms)
        print(f"run {run + 1}: {ms:.2f} ms", file=sys.stderr, flush=True)
    print(json.dumps({"ms": statistics.median(times), "runs_ms": times}), flush=True)
    os._exit(0)  # skip engine teardown: the supervisor only waits for the line


# ------------------------------------------------------------ supervisor side

def load_dump(path):
    """Loads and bounds-checks a dump: every descriptor must lie inside both
    buffers (upstream's initiator writes wherever the list says)."""
    with open(path) as f:
        d = json.load(f)
    for key in ("layout", "tokens", "pattern", "src_bytes", "dst_bytes", "ranks"):
        if key not in d:
            raise ValueError(f"{path}: no '{key}'")
    src, dst = d["src_bytes"], d["dst_bytes"]
    if not (isinstance(src, int) and isinstance(dst, int) and 0 < src <= MAX_BUFFER and 0 < dst <= MAX_BUFFER):
        raise ValueError(f"{path}: src_bytes/dst_bytes out of range")
    if not isinstance(d["ranks"], list) or not 1 <= len(d["ranks"]) <= 16:
        raise ValueError(f"{path}: 'ranks' must list 1 to 16 ranks")
    for i, r in enumerate(d["ranks"]):
        descs = r.get("descriptors") if isinstance(r, dict) else None
        if not isinstance(descs, list) or not descs:
            raise ValueError(f"{path}: rank {i} has no descriptors")
        for e in descs:
            if (not isinstance(e, list) or len(e) != 3 or not all(isinstance(x, int) for x in e)
                    or e[0] < 0 or e[1] < 0 or e[2] <= 0 or e[0] + e[2] > src or e[1] + e[2] > dst):
                raise ValueError(f"{path}: rank {i}: descriptor {e} outside the buffers")
    return d


def kill(proc):
    """Kills a child we started, and its process group (it leads one)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


GLOG = re.compile(r"^[WEF]\d{4} [\d:.]+ +\d+ ([^\]]+)\] (.*)")


def why(path):
    """The reason a child failed, from its log: the exception it raised (or
    its last line), with the last upstream warning or error before it."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return ""
    end = next((i for i, ln in enumerate(lines) if ln.startswith("Traceback")), len(lines))
    exc = next((ln for ln in reversed(lines) if re.match(r"^[A-Za-z_.]+(Error|Exception): ", ln)), None)
    note = next((GLOG.match(ln) for ln in reversed(lines[:end]) if GLOG.match(ln)
                 and "Local segment descriptor not found" not in ln and "default malloc" not in ln), None)
    text = exc or (lines[-1] if lines else "no output")
    if note:
        text += f" [upstream {note.group(1)}: {note.group(2)}]"
    return text[:400]


def spawn(argv, log, extra_env, stdin=subprocess.DEVNULL):
    env = dict(os.environ, **ENGINE_ENV, **extra_env)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=open(log, "w"), env=env,
                            start_new_session=True, preexec_fn=die_with_parent)


def read_line(proc, deadline):
    """One stdout line from a child, or None on exit/deadline."""
    buf = b""
    fd = proc.stdout.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buf += chunk
    return buf.decode(errors="replace")


def replay(path, args, env, workdir, children):
    result = {"layout": None, "tokens": None, "pattern": None, "path": "upstream-tcp",
              "descriptors": None, "bytes": None, "ms": None, "gbps": None, "upstream_op": args.op}
    if env:
        result["upstream_env"] = " ".join(f"{k}={v}" for k, v in env.items())
    try:
        dump = load_dump(path)
    except (OSError, ValueError) as e:
        result["error"] = f"bad dump: {e}"
        return result
    all_descs = [e for r in dump["ranks"] for e in r["descriptors"]]
    result.update(layout=dump["layout"], tokens=dump["tokens"], pattern=dump["pattern"],
                  descriptors=len(all_descs), bytes=sum(e[2] for e in all_descs))
    deadline = time.monotonic() + args.timeout
    stage = "starting the upstream targets"
    try:
        targets = []
        # read: one target per prefill rank holding its KV cache (two ranks are
        # two processes, like two prefill workers); write: the decode target.
        serving = ([(rank, dump["src_bytes"]) for rank in range(len(dump["ranks"]))] if args.op == "read"
                   else [(-1, dump["dst_bytes"])])
        for rank, size in serving:
            log = os.path.join(workdir, f"target-{len(targets)}.log")
            p = spawn(["--serve", "--rank", str(rank), "--bytes", str(size)], log, env, stdin=subprocess.PIPE)
            children.append(p)
            line = read_line(p, deadline)
            if line is None:
                raise RuntimeError(f"upstream target {len(targets)} did not start: {why(log)}")
            targets.append(json.loads(line))
        stage = "replaying"
        log = os.path.join(workdir, "initiator.log")
        ini = spawn(["--initiate", path, "--targets", json.dumps(targets), "--runs", str(args.runs),
                     "--samples", str(args.samples), "--op", args.op], log, env)
        children.append(ini)
        line = read_line(ini, deadline)
        if line is None:
            with open(log, errors="replace") as f:
                done = sum(1 for ln in f if ln.startswith("run "))
            if time.monotonic() >= deadline:
                raise RuntimeError(f"timed out after {args.timeout:g} s ({done} of {args.runs} runs done)")
            raise RuntimeError(why(log) if os.path.getsize(log) else f"initiator exited with {ini.wait()}")
        r = json.loads(line)
        result["ms"] = r["ms"]
        result["gbps"] = result["bytes"] / r["ms"] / 1e6
        print(f"kv_upstream_replay: {os.path.basename(path)}: runs "
              + ", ".join(f"{t:.1f}" for t in r["runs_ms"]) + " ms", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - one failed case must not stop the others
        if time.monotonic() >= deadline and "timed out" not in str(e):
            e = f"timed out after {args.timeout:g} s while {stage}"
        result["error"] = str(e)
    finally:
        while children:
            kill(children.pop())
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", nargs="*", help="descriptor dumps (kv_bench --dump-descriptors)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per case (median kept)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per case, start-up included")
    ap.add_argument("--samples", type=int, default=64, help="descriptors checked per rank and run")
    ap.add_argument("--op", choices=("read", "write"), default="read",
                    help="read: the decode side pulls (batch_transfer_sync_read, default); write: each "
                         "prefill rank pushes (batch_transfer_sync_write)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for the upstream engines (repeatable), e.g. "
                         "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER=32768; the output line then names it")
    ap.add_argument("--retry-env", action="append", default=[], metavar="NAME=VALUE",
                    help="replay a case that failed once more with these settings added (repeatable); "
                         "both lines are printed")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--initiate", metavar="DUMP", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--targets", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.runs = max(1, args.runs)
    args.samples = max(2, args.samples)

    def env_of(items, flag):
        env = {}
        for item in items:
            name, eq, value = item.partition("=")
            if not eq or not name:
                ap.error(f"{flag} {item}: expected NAME=VALUE")
            env[name] = value
        return env

    args.extra_env = env_of(args.env, "--env")
    args.retry_env = env_of(args.retry_env, "--retry-env")
    if args.serve:
        return serve(args)
    if args.initiate:
        args.dump = args.initiate
        return initiate(args)
    if not args.dumps:
        ap.error("no dump given")

    children = []

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # KV_REPLAY_LOGS=DIR keeps the engines' logs of the last case there.
    keep = os.environ.get("KV_REPLAY_LOGS")
    if keep:
        os.makedirs(keep, exist_ok=True)
    workdir = keep or tempfile.mkdtemp(prefix="mc-kv-upstream-")
    try:
        for path in args.dumps:
            result = replay(path, args, args.extra_env, workdir, children)
            print(json.dumps(result), flush=True)
            if "error" in result and args.retry_env:
                retry = replay(path, args, {**args.extra_env, **args.retry_env}, workdir, children)
                print(json.dumps(retry), flush=True)
    finally:
        while children:
            kill(children.pop())
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
