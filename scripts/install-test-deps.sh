#!/usr/bin/env bash
# Installs what the full test suite needs beyond Rust and g++, idempotently:
#  - Debian: libibverbs1 and libnuma1 (the upstream wheel imports them even
#    for TCP), libibverbs-dev (`make -C vendor verbs-abi-check` compares our
#    verbs declarations with its header), libclang-dev (the bindings
#    freshness check runs bindgen), iproute2 when `ip` is missing (the
#    network-namespace test), clang and libclang-rt-14-dev (the libFuzzer
#    runtime: `make -C vendor fuzz`), etcd-server, etcd-client and
#    redis-server (the metadata-store tests start their own on free
#    127.0.0.1 ports; the packages' own services are not used);
#  - a Python venv at .venv-upstream with upstream Mooncake 0.3.13
#    (mooncake-transfer-engine-non-cuda==0.3.13.post1), pyzmq and msgspec
#    for interop tests;
#  - the CUDA 12 and 13 runtimes from PyPI in .cuda/ (headers and
#    libcudart_static.a), for the cuda12/cuda13 builds (no toolkit needed).
# With --upstream-only: only what the upstream wheel needs (libibverbs1,
# libnuma1 and the venv), as scripts/perf-compare.sh uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
UPSTREAM_ONLY=0
[ "${1:-}" = "--upstream-only" ] && UPSTREAM_ONLY=1

UPSTREAM_PKG="mooncake-transfer-engine-non-cuda==0.3.13.post1"
# vLLM's side channel, for the connector interop tests.
SIDE_PKGS=(pyzmq msgspec)
VENV=.venv-upstream

need_apt=()
APT_PKGS=(libibverbs1 libibverbs-dev libnuma1 libclang-dev clang libclang-rt-14-dev etcd-server etcd-client redis-server)
[ "$UPSTREAM_ONLY" = 1 ] && APT_PKGS=(libibverbs1 libnuma1)
for pkg in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
# `ip` and `tc` for the network-namespace test (make -C vendor netns-test).
if [ "$UPSTREAM_ONLY" = 0 ] && ! command -v ip >/dev/null && [ ! -x /usr/sbin/ip ] && [ ! -x /sbin/ip ]; then
  need_apt+=(iproute2)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-test-deps: installing ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if ! $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}" >/tmp/mooncake-apt.log 2>&1; then
    $SUDO apt-get update >/tmp/mooncake-apt-update.log 2>&1 || true
    $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}" >/tmp/mooncake-apt.log 2>&1 || {
      echo "install-test-deps: apt-get failed; see /tmp/mooncake-apt.log. Install: ${need_apt[*]}" >&2
      exit 1
    }
  fi
fi

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import mooncake.engine, zmq, msgspec" 2>/dev/null; then
  echo "install-test-deps: upstream Mooncake already in $VENV"
else
  echo "install-test-deps: creating $VENV with $UPSTREAM_PKG"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$UPSTREAM_PKG" "${SIDE_PKGS[@]}"
  "$VENV/bin/python" -c "import mooncake.engine" || {
    echo "install-test-deps: the upstream wheel does not import (missing libibverbs1/libnuma1?)" >&2
    exit 1
  }
fi

[ "$UPSTREAM_ONLY" = 1 ] || scripts/install-cuda-runtimes.sh
