#!/usr/bin/env bash
# The async API's tests (mooncake/tests/async_api.rs: futures and batches
# dropped while their transfers run, timeouts, thousands of concurrent
# reads, a waker that drops its task) against an engine compiled with
# AddressSanitizer: a transfer that writes into memory the Rust side has
# already freed, or past the end of a buffer, is reported and fails the run.
# Only the engine (C++) is instrumented; the Rust code is not (that needs a
# nightly compiler), but its heap allocations go through ASan's malloc. The
# ASan runtime is preloaded because rustc links with -nodefaultlibs, which
# leaves it out of the initial library list. Leak checking is off: the
# tests leak one batch on purpose.
#   scripts/asan-async.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=target/asan
CXXFLAGS="-fsanitize=address -fno-omit-frame-pointer" RUSTFLAGS="-C link-arg=-lasan" \
  cargo test -q -p mooncake --test async_api --no-run
bin=$(ls -t "$CARGO_TARGET_DIR"/debug/deps/async_api-* | grep -v '\.d$' | head -n 1)
LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 "$bin"
