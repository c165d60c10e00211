#!/usr/bin/env bash
# Our engine against upstream Mooncake 0.3.13 on this machine, in one go:
# installs the upstream wheel (the .venv-upstream of install-test-deps.sh)
# and iperf3 when missing, builds our bench, then runs both engines'
# transfer_engine_bench in every pairing (upstream/upstream, ours/ours,
# ours->upstream, upstream->ours), our same-host path, 4 KiB request rates
# and iperf3, each RUNS times, and prints one table of medians and ratios.
#
#   scripts/perf-compare.sh [--runs N] [--duration S] [--quick]
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
cargo build --release -q --example transfer_engine_bench >&2
exec .venv-upstream/bin/python scripts/perf_compare.py "$@"
