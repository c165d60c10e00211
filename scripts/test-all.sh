#!/usr/bin/env bash
# The whole test suite: formatting, lints, the C++ engine's own tests (plain,
# ASan/UBSan and TSan, all with -Wall -Wextra -Werror), every Rust test
# including interop with upstream Mooncake, the bindings freshness check and
# the docs. Installs missing test dependencies first. FUZZ_SECONDS (default
# 20) is how long each libFuzzer target runs; longer runs: README, "Fuzzing".
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
# Each step's wall time is printed when the next starts, and all of them at
# the end, so a slow step shows in the CI log.
STEP_NAME="" STEP_START=$SECONDS STEP_TIMES=""
step_done() {
  [ -n "$STEP_NAME" ] || return 0
  local took=$((SECONDS - STEP_START))
  printf '    (%d s)\n' "$took"
  STEP_TIMES+=$(printf '%6d s  %s' "$took" "$STEP_NAME")$'\n'
}
step() { step_done; STEP_NAME="$*" STEP_START=$SECONDS; printf '\n==> %s\n' "$*"; }

step "test dependencies"
scripts/install-test-deps.sh

# cargo-semver-checks takes about ten minutes of CPU to build on two cores:
# build it at the lowest priority beside the steps below (the fuzzers and
# many tests leave a core idle) and wait for it at the semver step.
# Its own process group (job control on for this one job), ended on any
# exit, so a failed or interrupted run leaves no compiler behind holding
# target/tools. Not setsid: a new session is a new scheduler autogroup,
# where nice would count for nothing against the tests.
mkdir -p target
set -m
nice -n 19 scripts/semver-check.sh --install > target/semver-install.log 2>&1 &
semver_install=$!
set +m
trap 'kill -- -"$semver_install" 2>/dev/null || true' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

# The metadata-store tests start real etcd and redis-server (installed by
# scripts/install-test-deps.sh): here a missing one is a failure, not a skip.
export MC_REQUIRE_METADATA_SERVERS=1

step "C++ engine tests (-Wall -Wextra -Werror)"
make -s -C vendor -j"$JOBS" test

step "verbs ABI declarations match Debian's libibverbs-dev header"
make -s -C vendor verbs-abi-check

step "C++ engine tests under AddressSanitizer + UndefinedBehaviorSanitizer"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 make -s -C vendor -j"$JOBS" test SAN=1

step "C++ engine tests under ThreadSanitizer"
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/vendor/tests/tsan.supp" make -s -C vendor -j"$JOBS" test SAN=thread

step "multi-host: engines in two network namespaces, link cut mid-transfer"
make -s -C vendor -j"$JOBS" netns-test

FUZZ_SECONDS=${FUZZ_SECONDS:-20}
step "fuzz every peer-facing parser (${FUZZ_SECONDS} s each)"
make -s -C vendor -j"$JOBS" fuzz
make -s -C vendor fuzz-run FUZZ_SECONDS="$FUZZ_SECONDS"

export MOONCAKE_SYS_WERROR=1
step "clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (interop with upstream required)"
MOONCAKE_REQUIRE_UPSTREAM=1 cargo test --workspace

step "async API against an AddressSanitizer-built engine (futures dropped mid-transfer)"
scripts/asan-async.sh

step "committed bindings match the headers (bindgen)"
# DOCS_RS: the check compares text and calls nothing, so the engine is not
# compiled for it (the build script generates the bindings first).
DOCS_RS=1 CARGO_TARGET_DIR=target/docsrs cargo test -p mooncake-sys --features bindgen --test bindings_fresh

step "docs build without warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q

step "example: loopback"
cargo run -q --example loopback

# CUDA builds: against the PyPI runtimes in .cuda/ (no toolkit, no GPU here),
# found by the build itself: no CUDA variable is set. The whole CPU suite
# must pass with CUDA compiled in, GPU calls must fail cleanly, and the
# runtime must be linked statically.
unset MOONCAKE_CUDA_HOME CUDA_HOME CUDA_PATH CUDARC_CUDA_VERSION
# CUDA 13 (what vLLM users install) gets the whole C++ and Rust suites with
# CUDA compiled in; CUDA 12 gets its lints and tests over the crates that
# hold the CUDA code, and the link check. The compile-fail suite (trybuild)
# names no GPU type, so it runs once, in the CPU-only pass above.
for major in 13 12; do
  if [ "$major" = 13 ]; then
    step "CUDA $major: C++ engine tests with CUDA compiled in"
    make -s -C vendor -j"$JOBS" test CUDA=$major
    step "CUDA $major: clippy -D warnings --features cuda$major,mooncake/cudarc"
    cargo clippy --workspace --all-targets --features cuda$major,mooncake/cudarc -- -D warnings
    step "CUDA $major: cargo test --workspace --features cuda$major,mooncake/cudarc"
    MOONCAKE_SKIP_COMPILE_FAIL=1 MOONCAKE_REQUIRE_UPSTREAM=1 cargo test --workspace --features cuda$major,mooncake/cudarc
  else
    step "CUDA $major: clippy -D warnings and tests of mooncake-sys and mooncake --features cuda$major"
    cargo clippy -p mooncake-sys -p mooncake --all-targets --features cuda$major -- -D warnings
    MOONCAKE_SKIP_COMPILE_FAIL=1 cargo test -p mooncake-sys -p mooncake --features cuda$major
  fi
  step "CUDA $major: cargo build --features cuda$major (nothing set); gpu_loopback links no libcudart, without a GPU exits 2"
  cargo build -q --features cuda$major --example gpu_loopback
  if ldd target/debug/examples/gpu_loopback | grep libcudart; then
    echo "gpu_loopback links libcudart dynamically" >&2; exit 1
  fi
  rc=0; target/debug/examples/gpu_loopback || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 2 ] || { echo "gpu_loopback: want exit 0 (GPU) or 2 (none), got $rc" >&2; exit 1; }
done

step "cargo build --all-features (cuda12 + cuda13: either major)"
cargo build -q --workspace --all-features

# What docs.rs does: DOCS_RS set, the features of [package.metadata.docs.rs],
# no toolkit (the variable points nowhere: the build script must not look).
step "docs.rs build: DOCS_RS=1 --features cuda13,cudarc, no CUDA toolkit, warnings denied"
DOCS_RS=1 MOONCAKE_CUDA_HOME=/nonexistent CARGO_TARGET_DIR=target/docsrs RUSTDOCFLAGS="-D warnings" \
  cargo doc --no-deps -q -p mooncake-sys -p mooncake --features mooncake/cuda13,mooncake/cudarc

step "packaging: cargo package --workspace (verified, offline); the packages build and run alone"
MOONCAKE_SYS_OPT_LEVEL=0 scripts/check-package.sh

step "semver: public API of mooncake-sys and mooncake against the last release tag"
wait "$semver_install" || { cat target/semver-install.log; echo "building cargo-semver-checks failed" >&2; exit 1; }
scripts/semver-check.sh

step "end-to-end: prefill, decode and proxy processes (TP 1:1 at concurrency 1 and 64, 2:1, 1:2; PP 2:1 hybrid; MLA TP 2:1 into PP 2)"
# The threads at 64 concurrent requests may not exceed those at 1.
REQUESTS=64 CONCURRENCY=1 scripts/run_pd_example.sh
REQUESTS=64 CONCURRENCY=64 MAX_THREADS="$(cat target/pd-example/prefill.threads) $(cat target/pd-example/decode.threads)" \
  scripts/run_pd_example.sh
PREFILL_TP=2 DECODE_TP=1 scripts/run_pd_example.sh
# TP 1:2 behind a proxy without /health or /v1/models, as vLLM's own.
PROXY_HEALTH=none PREFILL_TP=1 DECODE_TP=2 scripts/run_pd_example.sh
# Parallel layouts as separate processes (each also in tests/parallel_layouts.rs):
# PP 2 -> 1 with a hybrid two-group model, MLA TP 2 -> TP 1 with PP 2.
PREFILL_PP=2 MODEL_ARGS="--hybrid --layers 5" scripts/run_pd_example.sh
PREFILL_TP=2 DECODE_PP=2 MODEL_ARGS="--mla --heads 1" scripts/run_pd_example.sh

step_done
printf '\nstep times:\n%s%6d s  total\n' "$STEP_TIMES" "$SECONDS"
printf '\nall tests passed\n'
