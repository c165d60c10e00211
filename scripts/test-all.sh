#!/usr/bin/env bash
# The whole test suite: formatting, lints, the C++ engine's own tests (plain,
# ASan/UBSan and TSan, all with -Wall -Wextra -Werror), every Rust test
# including interop with upstream Mooncake, the bindings freshness check and
# the docs. Installs missing test dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
step() { printf '\n==> %s\n' "$*"; }

step "test dependencies"
scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "C++ engine tests (-Wall -Wextra -Werror)"
make -s -C vendor -j"$JOBS" test

step "C++ engine tests under AddressSanitizer + UndefinedBehaviorSanitizer"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 make -s -C vendor -j"$JOBS" test SAN=1

step "C++ engine tests under ThreadSanitizer"
TSAN_OPTIONS=halt_on_error=1 make -s -C vendor -j"$JOBS" test SAN=thread

export MOONCAKE_SYS_WERROR=1
step "clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (interop with upstream required)"
MOONCAKE_REQUIRE_UPSTREAM=1 cargo test --workspace

step "committed bindings match the headers (bindgen)"
cargo test -p mooncake-sys --features bindgen --test bindings_fresh

step "docs build without warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q

step "example: loopback"
cargo run -q --example loopback

step "end-to-end: prefill, decode and proxy processes (TP 1:1, 2:1, 1:2)"
scripts/run_pd_example.sh
PREFILL_TP=2 DECODE_TP=1 scripts/run_pd_example.sh
PREFILL_TP=1 DECODE_TP=2 scripts/run_pd_example.sh

printf '\nall tests passed\n'
