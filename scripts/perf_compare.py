#!/usr/bin/env python3
"""Runs our transfer_engine_bench and upstream Mooncake's side by side on
127.0.0.1 and prints one table of median throughputs and ratios.

Configurations (each repeated --runs times, interleaved, median kept):
  TCP throughput, READ and WRITE, 64 KiB and 1 MiB blocks:
    upstream -> upstream, ours -> ours (same-host path off),
    ours -> upstream, upstream -> ours
  same-host path (ours -> ours, default settings), READ and WRITE
  4 KiB READ request rates on one connection and on four (TCP)
  iperf3, one stream over loopback (if installed)
  with --baseline BIN: the same ours/ours TCP and same-host cases with an
    older build of our bench (perf-compare.sh --baseline-rev REV builds
    one), interleaved with the current build, for a before/after table

With --markdown FILE the tables also go to FILE. Started by
scripts/perf-compare.sh, which installs what this needs.
Every number in the output comes from this one invocation.
"""
import argparse
import glob
import json
import os
import resource
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIB, MIB = 1024, 1024 * 1024


def find_upstream():
    hits = glob.glob(os.path.join(ROOT, ".venv-upstream/lib/python*/site-packages/mooncake/transfer_engine_bench"))
    return hits[0] if hits else None


def find_ours():
    tgt = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    p = os.path.join(tgt, "release/examples/transfer_engine_bench")
    return p if os.path.exists(p) else None


COMMON = ["--protocol=tcp", "--metadata_server=P2PHANDSHAKE", "--local_server_name=127.0.0.1"]


class Target:
    def __init__(self, kind, binary, workdir):
        self.kind = kind
        self.log = os.path.join(workdir, f"target-{kind}.log")
        env = dict(os.environ, GLOG_minloglevel="1")
        self.proc = subprocess.Popen([binary, "--mode=target", *COMMON],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     env=env, cwd=workdir, start_new_session=True)
        self.segment = None
        deadline = time.time() + 120
        pat = re.compile(r"listening on (\S+:\d+)")
        while time.time() < deadline:
            with open(self.log) as f:
                m = pat.search(f.read())
            if m:
                self.segment = m.group(1)
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not self.segment:
            self.stop()
            raise RuntimeError(f"{kind} target did not start; see {self.log}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def proc_cpu_seconds(pid):
    """utime + stime of a live process (all its threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_times():
    """(steal, total) jiffies of the whole machine, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[7] if len(v) > 7 else 0, sum(v[:8])
    except (OSError, ValueError):
        return 0, 0


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_initiator(binary, segment, op, block, args, extra, env_extra, workdir, target_pid):
    cmd = [binary, "--mode=initiator", *COMMON, f"--segment_id={segment}", f"--operation={op}",
           f"--block_size={block}", f"--threads={args.threads}", f"--batch_size={args.batch_size}",
           f"--duration={args.duration}", *extra]
    env = dict(os.environ, GLOG_minloglevel="0", **env_extra)
    t0, c0 = proc_cpu_seconds(target_pid), children_cpu_seconds()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 90,
                             env=env, cwd=workdir)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    t1, c1 = proc_cpu_seconds(target_pid), children_cpu_seconds()
    text = out.stdout + out.stderr
    m = re.search(r"duration ([\d.]+), batch count (\d+), throughput ([\d.]+) GB/s", text)
    if out.returncode != 0 or not m:
        return None, text.strip().splitlines()[-1] if text.strip() else f"exit {out.returncode}"
    secs, batches = float(m.group(1)), int(m.group(2))
    gbps = batches * args.batch_size * block / secs / 1e9
    reqs = batches * args.batch_size / secs
    gb = batches * args.batch_size * block / 1e9
    # CPU seconds both processes spent per GB moved (the target's share is
    # measured over the initiator's whole life, setup included).
    cpu = None if t0 is None or t1 is None or gb == 0 else ((t1 - t0) + (c1 - c0)) / gb
    return {"gbps": gbps, "reqs": reqs, "cpu_per_gb": cpu, "text": text}, None


def run_iperf(duration):
    exe = shutil.which("iperf3")
    if not exe:
        return None, "iperf3 not installed"
    port = 15990 + os.getpid() % 500
    srv = subprocess.Popen([exe, "-s", "-B", "127.0.0.1", "-p", str(port), "-1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        out = subprocess.run([exe, "-c", "127.0.0.1", "-p", str(port), "-t", str(duration), "-J"],
                             capture_output=True, text=True, timeout=duration + 30)
        d = json.loads(out.stdout)
        return {"gbps": d["end"]["sum_received"]["bits_per_second"] / 8e9}, None
    except Exception as e:  # noqa: BLE001 - reported in the table
        return None, f"iperf3 failed: {e}"
    finally:
        if srv.poll() is None:
            srv.terminate()
        srv.wait()


class Tee:
    """stdout that also writes to a file (--markdown)."""

    def __init__(self, *outs):
        self.outs = outs

    def write(self, text):
        for o in self.outs:
            o.write(text)

    def flush(self):
        for o in self.outs:
            o.flush()


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="repetitions per configuration (median kept)")
    ap.add_argument("--duration", type=int, default=5, help="seconds per bench run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="64 KiB READ/WRITE only, for tuning")
    ap.add_argument("--same-host-only", action="store_true",
                    help="only our same-host path (and the baseline's, with --baseline): a longer A/B of that path")
    ap.add_argument("--baseline", help="an older build of our transfer_engine_bench, for a before/after table")
    ap.add_argument("--baseline-label", default="baseline", help="what to call it in the table")
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables to FILE")
    args = ap.parse_args()
    if args.markdown:
        sys.stdout = Tee(sys.stdout, open(args.markdown, "w"))

    ours, up = find_ours(), find_upstream()
    if not ours:
        sys.exit("our bench is not built: cargo build --release --example transfer_engine_bench")
    if not up:
        sys.exit("upstream's transfer_engine_bench is missing: scripts/install-test-deps.sh --upstream-only")

    workdir = tempfile.mkdtemp(prefix="mc-perf-")
    bins = {"ours": ours, "up": up}
    if args.baseline:
        if not os.path.exists(args.baseline):
            sys.exit(f"--baseline {args.baseline}: no such file")
        bins["base"] = args.baseline
    blocks = [64 * KIB] if args.quick else [64 * KIB, MIB]
    cases = []  # (key, target, initiator, op, block, extra, env)
    for block in blocks:
        for op in ("read", "write"):
            if not args.same_host_only:
                cases.append((("tcp", op, block, "up/up"), "up", "up", op, block, [], {}))
                cases.append((("tcp", op, block, "ours/ours"), "ours", "ours", op, block, ["--same_host=off"], {}))
                cases.append((("tcp", op, block, "ours->up"), "up", "ours", op, block, [], {}))
                cases.append((("tcp", op, block, "up->ours"), "ours", "up", op, block, [], {}))
            cases.append((("same", op, block, "ours/ours"), "ours", "ours", op, block, [], {}))
            if args.baseline:
                if not args.same_host_only:
                    cases.append((("tcp", op, block, "base/base"), "base", "base", op, block, ["--same_host=off"],
                                  {}))
                cases.append((("same", op, block, "base/base"), "base", "base", op, block, [], {}))
    if not args.quick and not args.same_host_only:
        for lanes in (1, 4):
            cases.append((("rate", "read", 4 * KIB, f"up/up lanes={lanes}"), "up", "up", "read", 4 * KIB, [],
                          {"MC_TCP_LANES_PER_PEER": str(lanes)}))
            cases.append((("rate", "read", 4 * KIB, f"ours/ours lanes={lanes}"), "ours", "ours", "read", 4 * KIB,
                          ["--same_host=off", f"--lanes={lanes}"], {}))

    load0 = os.getloadavg()
    steal0 = cpu_times()
    t0 = time.time()
    results = {c[0]: [] for c in cases}
    iperf = []
    failures = []
    targets = {}
    try:
        for kind in bins:
            if any(c[1] == kind for c in cases):  # no idle target beside the measured ones
                targets[kind] = Target(kind, bins[kind], workdir)
        for rep in range(args.runs):
            for key, tgt, ini, op, block, extra, env in cases:
                r, err = run_initiator(bins[ini], targets[tgt].segment, op, block, args, extra, env, workdir,
                                       targets[tgt].proc.pid)
                if r is None:
                    failures.append(f"{key}: {err}")
                    print(f"  run {rep + 1} {key}: FAILED: {err}", file=sys.stderr)
                    continue
                results[key].append(r)
                cpu = f", {r['cpu_per_gb']:.3f} CPU s/GB" if r["cpu_per_gb"] is not None else ""
                print(f"  run {rep + 1} {key}: {r['gbps']:.2f} GB/s, {r['reqs']:.0f} req/s{cpu}", file=sys.stderr)
            r, err = (None, "not run (--same-host-only)") if args.same_host_only else run_iperf(args.duration)
            if r:
                iperf.append(r["gbps"])
                print(f"  run {rep + 1} iperf3: {r['gbps']:.2f} GB/s", file=sys.stderr)
            else:
                print(f"  run {rep + 1} iperf3: {err}", file=sys.stderr)
    finally:
        for t in targets.values():
            t.stop()

    def med(key, field="gbps"):
        v = [r[field] for r in results.get(key, []) if r.get(field) is not None]
        return statistics.median(v) if v else None

    ip = statistics.median(iperf) if iperf else None
    load1 = os.getloadavg()
    steal1 = cpu_times()
    steal = (steal1[0] - steal0[0]) / max(1, steal1[1] - steal0[1]) * 100
    print(f"# mooncake-rs vs upstream Mooncake 0.3.13 (transfer_engine_bench), 127.0.0.1")
    print(f"# {os.cpu_count()} CPUs, load average {load0[0]:.2f} at start, {load1[0]:.2f} at end, "
          f"{steal:.0f}% of CPU time stolen by the hypervisor during the run; "
          f"{args.runs} runs × {args.duration} s each, median; threads={args.threads}, "
          f"batch_size={args.batch_size}; {time.time() - t0:.0f} s in all")
    print()
    print("TCP transport, GB/s (ratios: ours/ours ÷ upstream/upstream; ours/ours ÷ iperf3)")
    print()
    print("| op | block | upstream/upstream | ours/ours | ours→upstream | upstream→ours | ours ÷ upstream | ours ÷ iperf3 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    checks = []
    for block in blocks:
        for op in ("read", "write"):
            uu, oo = med(("tcp", op, block, "up/up")), med(("tcp", op, block, "ours/ours"))
            ou, uo = med(("tcp", op, block, "ours->up")), med(("tcp", op, block, "up->ours"))
            r1, r2 = ratio(oo, uu), ratio(oo, ip)
            label = f"{block // KIB} KiB" if block < MIB else f"{block // MIB} MiB"
            print(f"| {op.upper()} | {label} | {fmt(uu)} | {fmt(oo)} | {fmt(ou)} | {fmt(uo)} | "
                  f"{fmt(r1)}× | {fmt(r2 * 100 if r2 else None, 0)}% |")
            checks.append((f"TCP {op.upper()} {label}: ours ≥ 1.5× upstream", r1 is not None and r1 >= 1.5, fmt(r1) + "×"))
            if ip:
                checks.append((f"TCP {op.upper()} {label}: ours ≥ 85% of iperf3", r2 is not None and r2 >= 0.85,
                               fmt(r2 * 100 if r2 else None, 0) + "%"))
            for name, v in (("ours→upstream", ou), ("upstream→ours", uo)):
                rr = ratio(v, uu)
                checks.append((f"TCP {op.upper()} {label}: {name} ≥ upstream/upstream", rr is not None and rr >= 1.0,
                               fmt(rr) + "×"))
    print()
    print(f"iperf3 (one stream, loopback): {fmt(ip)} GB/s")
    print()
    print("CPU seconds per GB moved, both processes together (less depends on other tenants' load "
          "than GB/s; upstream's initiator busy-polls, which counts here)")
    print()
    print("| op | block | upstream/upstream | ours/ours TCP | ours same-host |")
    print("|---|---:|---:|---:|---:|")
    for block in blocks:
        for op in ("read", "write"):
            label = f"{block // KIB} KiB" if block < MIB else f"{block // MIB} MiB"
            print(f"| {op.upper()} | {label} | {fmt(med(('tcp', op, block, 'up/up'), 'cpu_per_gb'), 3)} | "
                  f"{fmt(med(('tcp', op, block, 'ours/ours'), 'cpu_per_gb'), 3)} | "
                  f"{fmt(med(('same', op, block, 'ours/ours'), 'cpu_per_gb'), 3)} |")
    print()
    print("Same-host path (ours → ours on one host, cross-memory attach), GB/s")
    print()
    print("| op | block | same-host | ÷ upstream TCP | ÷ ours TCP |")
    print("|---|---:|---:|---:|---:|")
    for block in blocks:
        for op in ("read", "write"):
            sh = med(("same", op, block, "ours/ours"))
            uu, oo = med(("tcp", op, block, "up/up")), med(("tcp", op, block, "ours/ours"))
            label = f"{block // KIB} KiB" if block < MIB else f"{block // MIB} MiB"
            r = ratio(sh, uu)
            print(f"| {op.upper()} | {label} | {fmt(sh)} | {fmt(r)}× | {fmt(ratio(sh, oo))}× |")
            if block == MIB:
                checks.append((f"same-host {op.upper()} 1 MiB ≥ 3× upstream TCP", r is not None and r >= 3.0, fmt(r) + "×"))
                r5 = ratio(sh, oo)
                checks.append((f"same-host {op.upper()} 1 MiB ≥ 5× ours TCP", r5 is not None and r5 >= 5.0,
                               fmt(r5) + "×"))
    if args.baseline:
        print()
        print(f"Before/after, same run: {args.baseline_label} = {args.baseline}, now = {ours}; GB/s")
        print()
        print("| path | op | block | before | now | now ÷ before |")
        print("|---|---|---:|---:|---:|---:|")
        for path in ("tcp", "same"):
            for block in blocks:
                for op in ("read", "write"):
                    b, n = med((path, op, block, "base/base")), med((path, op, block, "ours/ours"))
                    label = f"{block // KIB} KiB" if block < MIB else f"{block // MIB} MiB"
                    r = ratio(n, b)
                    name = "TCP" if path == "tcp" else "same-host"
                    print(f"| {name} | {op.upper()} | {label} | {fmt(b)} | {fmt(n)} | {fmt(r)}× |")
                    if path == "tcp":
                        # Within 5%: the run-to-run spread of one cell on this class of machine.
                        checks.append((f"TCP {op.upper()} {label}: now ≥ 95% of {args.baseline_label}",
                                       r is not None and r >= 0.95, fmt(r) + "×"))
    if not args.quick:
        print()
        print("4 KiB READs, requests per second (TCP)")
        print()
        print("| connections | upstream | ours | ours ÷ upstream |")
        print("|---:|---:|---:|---:|")
        for lanes in (1, 4):
            u = med(("rate", "read", 4 * KIB, f"up/up lanes={lanes}"), "reqs")
            o = med(("rate", "read", 4 * KIB, f"ours/ours lanes={lanes}"), "reqs")
            r = ratio(o, u)
            print(f"| {lanes} | {fmt(u, 0)} | {fmt(o, 0)} | {fmt(r)}× |")
            checks.append((f"4 KiB READ rate, {lanes} connection(s): ours ≥ 2× upstream", r is not None and r >= 2.0,
                           fmt(r) + "×"))
    if args.same_host_only:  # the TCP cells above were not measured
        checks = [c for c in checks if c[0].startswith("same-host")]
    print()
    print("Targets:")
    for name, ok, val in checks:
        print(f"- {'PASS' if ok else 'MISS'} {name} ({val})")
    if failures:
        print()
        print("Failed runs:")
        for f in failures:
            print(f"- {f}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
