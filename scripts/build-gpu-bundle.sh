#!/usr/bin/env bash
# Builds everything the GPU lane runs, for a cuda12 and a cuda13 build, into
# target/gpu-bundle/ so it can be carried to a GPU machine that has only a
# driver (no Rust, no toolkit): the C++ engine tests, gpu_bench and the
# softverbs stand-in NICs for the GPU RDMA registration test (static
# libstdc++), the Rust GPU tests, the gpu_loopback example and kv_bench. The CUDA
# runtime is linked statically in all of them.
#   scripts/build-gpu-bundle.sh && target/gpu-bundle/run.sh   # on the GPU host
# MAJORS="13" builds one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-cuda-runtimes.sh
out=target/gpu-bundle
rm -rf "$out"
for major in ${MAJORS:-12 13}; do
  case $major in
    12) home=$PWD/.cuda/cu12/nvidia/cuda_runtime ;;
    13) home=$PWD/.cuda/cu13/nvidia/cu13 ;;
  esac
  d=$out/cu$major
  mkdir -p "$d"
  make -s -C vendor -j"$(nproc)" CUDA=$major CUDA_HOME="$home" BUILD=build/bundle-cu$major \
    LDEXTRA="-static-libstdc++ -static-libgcc" all gpu_bench
  cp vendor/build/bundle-cu$major/engine_tests vendor/build/bundle-cu$major/gpu_bench \
    vendor/build/bundle-cu$major/libmc_softverbs.so "$d/"
  export MOONCAKE_CUDA_HOME=$home
  # The cudarc test: cudarc's API version as a cudarc user picks it, the
  # first release of the bundle's major.
  tests=$(CUDARC_CUDA_VERSION=${major}000 cargo test --release -p mooncake --features cuda$major,cudarc --test gpu --no-run \
    --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')
  cp "$tests" "$d/rust_gpu_tests"
  cargo build -q --release --features cuda$major --example gpu_loopback --example kv_bench
  cp target/release/examples/gpu_loopback target/release/examples/kv_bench "$d/"
  strip "$d"/*
  if ldd "$d"/* | grep -q libcudart; then echo "build-gpu-bundle: libcudart is linked dynamically" >&2; exit 1; fi
done
cp scripts/gpu-lane.sh "$out/run.sh"
cp scripts/lane-step.sh "$out/lane-step.sh"
du -sh "$out"
