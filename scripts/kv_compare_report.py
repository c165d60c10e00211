#!/usr/bin/env python3
"""Merges kv_bench JSON lines (ours: path "tcp" and "same-host") with the
upstream replay's (scripts/kv_upstream_replay.py: path "upstream-tcp",
"upstream_op" read or write) into one markdown table, a row per
layout/tokens/pattern and a column group per upstream op, with throughput
ratios and the issue's KV targets as PASS/MISS lines.

    scripts/kv_compare_report.py FILE.jsonl [FILE.jsonl ...] [--markdown OUT.md]

Input lines have the keys layout, tokens, pattern, path, descriptors, bytes,
ms (median; null when the case failed, with an "error"), gbps. Upstream lines
may carry "upstream_env" (engine settings other than the defaults): a cell
shows upstream with its defaults when that case completed, else the line
with other settings that did, marked † (the settings and the default run's
error are listed under the table). An optional line {"meta": {...}}
(written by scripts/perf-compare.sh) supplies the header: date, commit,
runs, CPUs, load averages; lines {"note": "..."} are listed under the table. Lines that are not JSON objects are ignored.

Ratios are throughput ours ÷ upstream (> 1: we are ahead). Targets, checked
on our two paths:
  - llama8b* and mla*: scattered ≥ 90% of contiguous throughput, per tokens and path;
  - small: scattered ≥ 70% of contiguous, and ≥ 500k descriptors/s scattered;
  - per layout, pattern and path: the 32768-token time ≤ 4.5× the 8192-token time;
  - every row: ahead of upstream (an upstream case that failed counts as
    PASS*, marked as such, with its error listed below the table; a row
    without an upstream line is N/A).
Pure standard library; no engine is run.
"""
import argparse
import json
import sys

OURS = ("tcp", "same-host")
UP = "upstream-tcp"
PATTERNS = ("contiguous", "scattered")


def load(paths):
    cases, meta, dupes = {}, {"notes": []}, 0
    for path in paths:
        f = sys.stdin if path == "-" else open(path)
        with f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "meta" in d:
                    meta.update(d["meta"])
                    continue
                if "note" in d:
                    meta["notes"].append(str(d["note"]))
                    continue
                if not all(k in d for k in ("layout", "tokens", "pattern", "path")):
                    continue
                path_key = d["path"]
                if path_key == UP:
                    path_key = (UP, d.get("upstream_op", "read"), d.get("upstream_env", ""))
                key = (d["layout"], int(d["tokens"]), d["pattern"], path_key)
                dupes += key in cases
                cases[key] = d
    if dupes:
        print(f"kv_compare_report: {dupes} repeated case(s); the last line of each kept", file=sys.stderr)
    return cases, meta


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def ok(d):
    return d is not None and d.get("ms") not in (None, 0) and d.get("gbps") is not None


def ratio(a, b):
    return a["gbps"] / b["gbps"] if ok(a) and ok(b) and b["gbps"] else None


def layout_order(name):
    order = ["default", "llama8b", "llama8b-tp2to1", "mla", "small"]
    return (order.index(name) if name in order else len(order), name)


def report(cases, meta):
    out = []
    p = out.append
    rows = sorted({k[:3] for k in cases}, key=lambda r: (layout_order(r[0]), r[1], PATTERNS.index(r[2])
                                                        if r[2] in PATTERNS else 9, r[2]))
    ops = sorted({k[3][1] for k in cases if isinstance(k[3], tuple)})
    envs = sorted({k[3][2] for k in cases if isinstance(k[3], tuple) and k[3][2]})
    marks = {env: "†" * (i + 1) for i, env in enumerate(envs)}
    calls = " and ".join(f"batch_transfer_sync_{op}" for op in ops) or "no upstream lines"

    def pick(layout, tokens, pattern, op):
        """Upstream's line for a cell: its default settings when that case
        completed, else the first other setting that did (marked)."""
        lines = [cases.get((layout, tokens, pattern, (UP, op, env))) for env in [""] + envs]
        lines = [d for d in lines if d is not None]
        good = [d for d in lines if ok(d)]
        return (good or lines or [None])[0], lines

    p(f"# KV transfers: mooncake-rs connector vs upstream Mooncake 0.3.13 ({calls}), 127.0.0.1")
    if any(k in meta for k in ("date", "commit", "runs")):
        bits = [f"{k}: {meta[k]}" for k in ("date", "commit", "runs", "cpus", "load_start", "load_end", "seconds")
                if k in meta]
        p("# " + ", ".join(bits))
    p("")
    p("Times are medians in ms, throughput in GB/s (1e9 bytes/s); ratios are throughput "
      "ours ÷ upstream (> 1: ours is ahead). Upstream read: the decode side pulls each "
      "prefill rank's list with batch_transfer_sync_read; upstream write: each prefill rank "
      "pushes it with batch_transfer_sync_write.")
    for env, m in marks.items():
        p(f"{m}: upstream failed this case with its default settings (see below) and completed it "
          f"with {env}.")
    p("")
    head = ["layout", "tokens", "pattern", "descriptors", "ours TCP ms", "GB/s", "ours same-host ms", "GB/s"]
    for op in ops:
        head += [f"upstream {op} ms", "GB/s", "TCP ÷ up", "same-host ÷ up"]
    p("| " + " | ".join(head) + " |")
    p("|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|")
    notes, checks = [], []

    def note(d):
        notes.append(f"{d['layout']} {d['tokens']} {d['pattern']} {d['path']}"
                     + (f" {d['upstream_op']}" if d.get("upstream_op") else "")
                     + (f" ({d['upstream_env']})" if d.get("upstream_env") else "")
                     + f": {d.get('error', 'no time')}")
        return len(notes)

    def cell_ms(d, tried=()):
        refs = [note(x) for x in tried if x is not d and not ok(x)]
        if d is None:
            return "–"
        if not ok(d):
            refs.append(note(d))
            return "failed" + "".join(f"[{r}]" for r in refs)
        mark = marks.get(d.get("upstream_env", ""), "")
        return fmt(d["ms"]) + mark + "".join(f"[{r}]" for r in refs)

    for layout, tokens, pattern in rows:
        mine = {path: cases.get((layout, tokens, pattern, path)) for path in OURS}
        picks = {op: pick(layout, tokens, pattern, op) for op in ops}
        desc = next((d["descriptors"] for d in list(mine.values()) + [v[0] for v in picks.values()]
                     if d and d.get("descriptors") is not None), None)
        cells = [layout, str(tokens), pattern, "–" if desc is None else str(desc)]
        for path in OURS:
            d = mine[path]
            cells += [cell_ms(d), fmt(d["gbps"]) if ok(d) else "–"]
        for op in ops:
            u, tried = picks[op]
            cells += [cell_ms(u, tried), fmt(u["gbps"]) if ok(u) else "–"]
            for path in OURS:
                r = ratio(mine[path], u)
                cells.append(f"{fmt(r)}×" if r is not None else "–")
                if not ok(mine[path]):
                    continue
                name = f"{layout} {tokens} {pattern}: ours {path} ahead of upstream {op}"
                if u is None:
                    checks.append(("N/A", name, "no upstream result"))
                elif not ok(u):
                    checks.append(("PASS*", name, "upstream failed"))
                elif r is not None:
                    mark = marks.get(u.get("upstream_env", ""), "")
                    checks.append(("PASS" if r > 1 else "MISS", name, f"{r:.2f}×{mark}"))
        p("| " + " | ".join(cells) + " |")

    layouts = sorted({r[0] for r in rows}, key=layout_order)
    token_sets = {layout: sorted({r[1] for r in rows if r[0] == layout}) for layout in layouts}
    for layout in layouts:
        for path in OURS:
            for tokens in token_sets[layout]:
                c = cases.get((layout, tokens, "contiguous", path))
                s = cases.get((layout, tokens, "scattered", path))
                r = ratio(s, c)
                if layout.startswith(("llama8b", "mla")) and r is not None:
                    checks.append(("PASS" if r >= 0.9 else "MISS",
                                   f"{layout} {tokens} {path}: scattered ≥ 90% of contiguous", f"{r * 100:.0f}%"))
                if layout.startswith("small"):
                    if r is not None:
                        checks.append(("PASS" if r >= 0.7 else "MISS",
                                       f"{layout} {tokens} {path}: scattered ≥ 70% of contiguous", f"{r * 100:.0f}%"))
                    if ok(s) and s.get("descriptors"):
                        rate = s["descriptors"] / (s["ms"] / 1e3)
                        checks.append(("PASS" if rate >= 5e5 else "MISS",
                                       f"{layout} {tokens} {path}: scattered ≥ 500k descriptors/s",
                                       f"{rate / 1e3:.0f}k/s"))
            for pattern in PATTERNS:
                a = cases.get((layout, 8192, pattern, path))
                b = cases.get((layout, 32768, pattern, path))
                if ok(a) and ok(b):
                    x = b["ms"] / a["ms"]
                    checks.append(("PASS" if x <= 4.5 else "MISS",
                                   f"{layout} {pattern} {path}: 32k time ≤ 4.5× 8k time", f"{x:.2f}×"))
    p("")
    if meta["notes"]:
        p("Notes:")
        p("")
        for n in meta["notes"]:
            p(f"- {n}")
        p("")
    if notes:
        p("Failed runs (upstream's failures with its default settings included):")
        p("")
        for i, n in enumerate(notes, 1):
            p(f"{i}. {n}")
        p("")
    counts = {k: sum(1 for c in checks if c[0] == k) for k in ("PASS", "PASS*", "MISS", "N/A")}
    p(f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS"
      + (f", {counts['PASS*']} PASS* (upstream failed the case; ours completed it)" if counts["PASS*"] else "")
      + (f", {counts['N/A']} N/A (no upstream line for the row)" if counts["N/A"] else ""))
    p("")
    for status, name, val in checks:
        p(f"- {status} {name} ({val})")
    return "\n".join(out) + "\n", counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON-lines files ('-' for stdin)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the report to FILE")
    args = ap.parse_args()
    cases, meta = load(args.files)
    if not cases:
        sys.exit("kv_compare_report: no cases in the input")
    text, _ = report(cases, meta)
    sys.stdout.write(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
