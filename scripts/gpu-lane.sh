#!/usr/bin/env bash
# The GPU lane, run on a machine with a GPU and a driver from the bundle that
# scripts/build-gpu-bundle.sh makes (copied next to this script as run.sh).
# For the cuda12 and the cuda13 build: the C++ GPU tests, the Rust GPU tests,
# the gpu_loopback example, gpu_bench (64 MiB paths and KV layouts) and
# kv_bench --gpu. Logs go to $OUT (or ./gpu-lane-logs).
# With two GPUs visible the two-GPU tests and bench rows run too; on the
# two-GPU machine run it as `MOONCAKE_GPU2_TESTS=1 run.sh`, which makes a
# missing second GPU a failure instead of a skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-lane-logs}
mkdir -p "$out"
export MOONCAKE_GPU_TESTS=1
status=0
. "$here/lane-step.sh"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m; uname -r;
  ldd --version | head -1; } >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
# Arguments pick builds (e.g. `run.sh cu13`); default both.
for b in ${@:-cu12 cu13}; do
  d=$here/$b
  [ -d "$d" ] || continue
  ldd "$d/engine_tests" "$d/rust_gpu_tests" >"$out/$b-ldd.txt" 2>&1
  # The stand-in NICs travel in the bundle, away from the path compiled in.
  step "$b C++ gpu tests" "$out/$b-engine-gpu.txt" \
    env MC_SOFTVERBS_PATH="$d/libmc_softverbs.so" timeout 300 "$d/engine_tests" ^gpu_
  step "$b Rust gpu tests" "$out/$b-rust-gpu.txt" timeout 300 "$d/rust_gpu_tests" --test-threads=1 --nocapture
  step "$b gpu_loopback example" "$out/$b-gpu-loopback.txt" timeout 120 "$d/gpu_loopback"
  step "$b gpu_bench 64 MiB" "$out/$b-gpu-bench.txt" timeout 240 "$d/gpu_bench" 64 20
  cat "$out/$b-gpu-bench.txt"
  # KV layouts in GPU memory: the full table for the build the H200 runs
  # with (CUDA 13), a smoke run for the other.
  if [ "$b" = cu13 ]; then kv=(--layout llama8b,mla,small --runs 3); else kv=(--layout llama8b --tokens 2048 --runs 1); fi
  step "$b gpu_bench kv" "$out/$b-gpu-bench-kv.txt" timeout 240 "$d/gpu_bench" kv --iters 3
  cat "$out/$b-gpu-bench-kv.txt"
  step "$b kv_bench --gpu" "$out/$b-kv-gpu.txt" timeout 600 "$d/kv_bench" --gpu "${kv[@]}"
  cat "$out/$b-kv-gpu.txt"
done
exit $status
