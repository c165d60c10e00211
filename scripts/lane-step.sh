# Sourced by the hardware lanes (gpu-lane.sh, rdma-hw-lane.sh): runs one
# step with its output in a log, appends "name rc=N  Ts" to
# $out/summary.txt, and on failure sets status=1 and shows the log's tail.
# The caller defines $out and status=0 before the first step.
step() { # name log command...
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  printf '%-34s rc=%d  %ds\n' "$name" "$rc" $((SECONDS - t0)) | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -n 40 "$log"; }
}
