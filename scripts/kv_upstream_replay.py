#!/usr/bin/env python3
"""Replays KV descriptor lists dumped by kv_bench through the upstream
Mooncake engine (the PyPI wheel mooncake-transfer-engine-non-cuda
0.3.13.post1), over TCP on 127.0.0.1, and prints one JSON line per dump.

    .venv-upstream/bin/python scripts/kv_upstream_replay.py DUMP.json [DUMP.json ...]
        [--runs N] [--timeout S] [--samples K]

A dump is what `kv_bench --dump-descriptors DIR` writes, one file per case:

    {"layout": "llama8b", "tokens": 8192, "pattern": "scattered",
     "src_bytes": <one prefill rank's KV buffer>, "dst_bytes": <decode KV buffer>,
     "ranks": [{"descriptors": [[src_off, dst_off, len], ...]}, ...]}

For each dump this process (the supervisor) starts one target process per
prefill rank (`--serve`): each initialises its own upstream TransferEngine on
127.0.0.1 (metadata P2PHANDSHAKE, protocol tcp), maps and registers a
src_bytes buffer filled with a per-rank pattern, and reports its session name
and buffer address. Two ranks (llama8b-tp2to1) thus get two target engines in
two processes, like two prefill workers. Then an initiator process
(`--initiate`) registers a dst_bytes buffer and, per run, calls
`batch_transfer_sync_read(target, dst addrs, src addrs, lengths)` once per rank
with that rank's whole list, the call vLLM's Mooncake connector makes for one
request; with several ranks the calls run in parallel threads, as a decode
worker pulls from several prefill workers at once. One untimed warm-up batch
per rank opens the segment and the data connections first. The result is the
median wall time of --runs runs (default 5).

Every run is checked: before it, sampled windows of the destination (the
start, middle and end of --samples descriptors per rank, first and last
included) are zeroed; after it they must hold the source pattern bytes of
their descriptor.

Output, one line per dump, with the keys of `kv_bench --json`:

    {"layout": ..., "tokens": ..., "pattern": ..., "path": "upstream-tcp",
     "descriptors": <all ranks>, "bytes": <all ranks>, "ms": <median>, "gbps": <GB/s, 1e9>}

A case that fails (non-zero return code, wrong bytes, an engine that does not
start, more than --timeout seconds (default 120) for the whole case) gives
"ms": null, "gbps": null and an "error" string instead of stopping the
remaining dumps.

Upstream's engines run with their default settings unless --env NAME=VALUE
says otherwise; the line then carries "upstream_env": "NAME=VALUE ...". With
its defaults the wheel's TCP transport admits about 2048 requests per peer
at a time (1024 queued + 1024 waiting for admission) and fails a larger
batch outright, so every scattered list of a long prompt fails there.
--retry-env NAME=VALUE replays such a failed case once more with those
settings added and prints that line too, e.g.
    --retry-env MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER=65535
    --retry-env MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER=65535
    --retry-env MC_TCP_ADMISSION_TIMEOUT_MS=600000
(65535 is the largest value the wheel accepts for the two limits). Every process this script starts is killed (by its PID) when
the case ends, and dies with the supervisor.

Memory: the source buffers are filled (resident), the destination is mapped
with MAP_NORESERVE and only the bytes written become resident; llama8b at
32k tokens scattered is about 4 GiB source and 4 of its 8 GiB destination.
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

def serve(args):
    engine = new_engine()
    mm, base = map_buffer(args.bytes, noreserve=False)
    pat = pattern(args.rank)[:PERIOD]
    for off in range(0, args.bytes, PERIOD):
        n = min(PERIOD, args.bytes - off)
        mm[off:off + n] = pat[:n]
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


def initiate(args):
    dump = load_dump(args.dump)
    targets = json.loads(args.targets)
    engine = new_engine()
    mm, dst_base = map_buffer(dump["dst_bytes"], noreserve=True)
    rc = engine.register_memory(dst_base, dump["dst_bytes"])
    if rc != 0:
        raise RuntimeError(f"register_memory({dump['dst_bytes']} bytes) returned {rc}")
    plans = []
    for rank, (r, t) in enumerate(zip(dump["ranks"], targets)):
        descs = r["descriptors"]
        plans.append({
            "rank": rank,
            "session": t["session"],
            "dst": [dst_base + d for _, d, _ in descs],
            "src": [t["base"] + s for s, _, _ in descs],
            "len": [n for _, _, n in descs],
            "checks": [(descs[i], windows(descs[i])) for i in samples_of(descs, args.samples)],
            "pattern": pattern(rank),
        })

    def call(plan, sl, out):
        try:
            out[plan["rank"]] = engine.batch_transfer_sync_read(
                plan["session"], plan["dst"][sl], plan["src"][sl], plan["len"][sl])
        except Exception as e:  # noqa: BLE001 - reported as the case's error
            out[plan["rank"]] = f"{type(e).__name__}: {e}"

    def issue(sl):
        out = {}
        if len(plans) == 1:
            call(plans[0], sl, out)
        else:
            threads = [threading.Thread(target=call, args=(p, sl, out)) for p in plans]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        for p in plans:
            if out.get(p["rank"]) != 0:
                raise RuntimeError(f"batch_transfer_sync_read (rank {p['rank']}, "
                                   f"{len(p['len'][sl])} descriptors) returned {out.get(p['rank'])}")

    issue(slice(0, 64))  # warm-up: segment lookup and data connections
    times = []
    for run in range(args.runs):
        for p in plans:
            for (_, d, _), ws in p["checks"]:
                for o, n in ws:
                    ctypes.memset(dst_base + d + o, 0, n)
        t0 = time.perf_counter()
        issue(slice(None))
        ms = (time.perf_counter() - t0) * 1e3
        for p in plans:
            for (s, d, _), ws in p["checks"]:
                for o, n in ws:
                    if mm[d + o:d + o + n] != expected(p["pattern"], s + o, n):
                        raise RuntimeError(f"verification failed: rank {p['rank']} descriptor "
                                           f"src_off={s} dst_off={d}, bytes {o}..{o + n} differ (run {run + 1})")
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
              "descriptors": None, "bytes": None, "ms": None, "gbps": None}
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
        for rank in range(len(dump["ranks"])):
            log = os.path.join(workdir, f"target-{rank}.log")
            p = spawn(["--serve", "--rank", str(rank), "--bytes", str(dump["src_bytes"])], log,
                      env, stdin=subprocess.PIPE)
            children.append(p)
            line = read_line(p, deadline)
            if line is None:
                raise RuntimeError(f"upstream target {rank} did not start: {why(log)}")
            targets.append(json.loads(line))
        stage = "replaying"
        log = os.path.join(workdir, "initiator.log")
        ini = spawn(["--initiate", path, "--targets", json.dumps(targets), "--runs", str(args.runs),
                     "--samples", str(args.samples)], log, env)
        children.append(ini)
        line = read_line(ini, deadline)
        if line is None:
            done = sum(1 for ln in open(log, errors="replace") if ln.startswith("run "))
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
