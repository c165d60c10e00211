#!/usr/bin/env bash
# Regenerates mooncake-sys/src/bindings.rs from the engine headers.
# Needs libclang (Debian: apt-get install libclang-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p mooncake-sys --features bindgen
out=$(ls -t target/debug/build/mooncake-sys-*/out/bindings.rs | head -1)
cp "$out" mooncake-sys/src/bindings.rs
echo "updated mooncake-sys/src/bindings.rs from $out"
