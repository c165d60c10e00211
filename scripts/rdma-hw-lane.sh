#!/usr/bin/env bash
# The RDMA hardware lane: runs the RDMA transport against the machine's real
# NICs (libibverbs.so.1 from rdma-core, or MC_VERBS_LIBRARY). Opt-in and
# strict: MOONCAKE_RDMA_HW_TESTS=1 is set here, so a machine without a usable
# NIC FAILS instead of skipping. Optional: MOONCAKE_RDMA_HW_DEVICES=mlx5_0,mlx5_1
# (allow list), MC_GID_INDEX, MC_IB_PORT and the other MC_* knobs of
# upstream Mooncake (README "RDMA"). Logs go to $OUT (or ./rdma-hw-lane-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/rdma-hw-lane-logs}
mkdir -p "$out"
export MOONCAKE_RDMA_HW_TESTS=1
unset MC_SOFTVERBS_DEVICES
status=0
{ uname -r; ls /sys/class/infiniband 2>&1; ls -l /dev/infiniband 2>&1; command -v ibv_devinfo >/dev/null && ibv_devinfo; } \
  >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  echo "rdma-hw-lane: no RDMA device under /sys/class/infiniband: this lane needs real NICs" >&2
  exit 1
fi
. scripts/lane-step.sh
step "build (vendor, build/hw)" "$out/build.txt" make -C vendor -j"$(nproc)" BUILD=build/hw all
step "C++ rdma_hw_loopback" "$out/hw-loopback.txt" timeout 300 vendor/build/hw/engine_tests rdma_hw_
grep -q "rdma_hw_loopback: " "$out/hw-loopback.txt" || { echo "rdma_hw_loopback did not run" >&2; status=1; }
exit $status
