#!/usr/bin/env bash
# Installs the CUDA runtime from PyPI for both majors, for building and
# testing the cuda12 and cuda13 features without a CUDA toolkit:
#   .cuda/cu12  nvidia-cuda-runtime-cu12 (12.x): nvidia/cuda_runtime/{include,lib}
#   .cuda/cu13  nvidia-cuda-runtime (13.x):       nvidia/cu13/{include,lib}
# Prints nothing when both are present.
set -euo pipefail
cd "$(dirname "$0")/.."
install() { # dir package marker
  if [ -f "$1/$3" ]; then return 0; fi
  echo "install-cuda-runtimes: $2 -> $1"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$1" "$2"
  [ -f "$1/$3" ] || { echo "install-cuda-runtimes: $2 did not provide $3" >&2; exit 1; }
}
install .cuda/cu12 "nvidia-cuda-runtime-cu12>=12.5,<13" nvidia/cuda_runtime/lib/libcudart_static.a
install .cuda/cu13 "nvidia-cuda-runtime>=13.0,<14" nvidia/cu13/lib/libcudart_static.a
