#!/usr/bin/env bash
# Our engine against upstream Mooncake 0.3.13 on this machine, in one go:
# installs the upstream wheel (the .venv-upstream of install-test-deps.sh)
# and iperf3 when missing, builds our bench, then runs both engines'
# transfer_engine_bench in every pairing (upstream/upstream, ours/ours,
# ours->upstream, upstream->ours), our same-host path, 4 KiB request rates
# and iperf3, each RUNS times, and prints one table of medians and ratios.
#
#   scripts/perf-compare.sh [--runs N] [--duration S] [--quick] [--baseline-rev REV]
#
# --baseline-rev REV also builds our bench at git revision REV (in a
# temporary worktree, its own target directory) and runs it interleaved
# with the current build: a before/after table from the same run.
#
# Needs the machine to itself for meaningful ratios (note the load average
# the table reports).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh --upstream-only >&2
if ! command -v iperf3 >/dev/null; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "perf-compare: installing iperf3" >&2
  $SUDO apt-get install -y iperf3 >/tmp/mooncake-apt-iperf3.log 2>&1 \
    || { $SUDO apt-get update >/dev/null 2>&1 && $SUDO apt-get install -y iperf3 >>/tmp/mooncake-apt-iperf3.log 2>&1; } \
    || echo "perf-compare: iperf3 could not be installed; its column stays empty" >&2
fi
args=()
baseline_rev=""
while [ $# -gt 0 ]; do
  case $1 in
    --baseline-rev) baseline_rev=$2; shift 2 ;;
    --baseline-rev=*) baseline_rev=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
cargo build --release -q --example transfer_engine_bench >&2
if [ -n "$baseline_rev" ]; then
  rev=$(git rev-parse --short "$baseline_rev")
  wt=$(mktemp -d /tmp/mc-baseline-XXXXXX)
  trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
  git worktree add -q --detach "$wt" "$rev"
  echo "perf-compare: building the baseline bench at $rev" >&2
  (cd "$wt" && CARGO_TARGET_DIR="$PWD/../mc-baseline-target-$rev" cargo build --release -q --example transfer_engine_bench) >&2
  mkdir -p target/baseline
  cp "$wt/../mc-baseline-target-$rev/release/examples/transfer_engine_bench" "target/baseline/transfer_engine_bench-$rev"
  args+=(--baseline "target/baseline/transfer_engine_bench-$rev" --baseline-label "$rev")
fi
.venv-upstream/bin/python scripts/perf_compare.py "${args[@]}"
