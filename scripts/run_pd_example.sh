#!/usr/bin/env bash
# Like vLLM's run_mooncake_connector.sh: starts the example prefiller
# (port 8010, bootstrap 8998), decoder (8020) and proxy (8000) on 127.0.0.1,
# sends a bounded set of requests through the proxy and checks every
# answer, then stops what it started (by PID). Exits non-zero on any
# mismatch, failed start or leftover KV.
#
# Environment: PREFILL_TP, DECODE_TP, PREFILL_PP, DECODE_PP (default 1),
# MODEL_ARGS (model flags for the engines and client), PREFILL_PORT, DECODE_PORT,
# PROXY_PORT, BOOTSTRAP_PORT, REQUESTS (16), CONCURRENCY (4), MAX_LEN,
# CARGO_PROFILE (debug|release, default debug), MAX_THREADS ("P D": fail if
# the prefiller's or decoder's peak thread count goes above these),
# PROXY_HEALTH (default "yes"; "none" starts the proxy with
# --completions-only, without /health and /v1/models like vLLM's
# mooncake_connector_proxy.py, so the client's readiness check falls back
# to a plain completion), WAIT_SECS (120: how long the client waits for
# the proxy).
#
# Nothing here waits on the proxy's /health: pd_client waits for
# /v1/models, or a plain completion where there is none.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFILL_TP=${PREFILL_TP:-1}
DECODE_TP=${DECODE_TP:-1}
PREFILL_PP=${PREFILL_PP:-1}
DECODE_PP=${DECODE_PP:-1}
# Model flags for both engines and the client, e.g. "--mla --heads 1",
# "--hybrid", "--layers 5" (word-split on purpose).
MODEL_ARGS=${MODEL_ARGS:-}
PREFILL_PORT=${PREFILL_PORT:-8010}
DECODE_PORT=${DECODE_PORT:-8020}
PROXY_PORT=${PROXY_PORT:-8000}
BOOTSTRAP_PORT=${BOOTSTRAP_PORT:-8998}
REQUESTS=${REQUESTS:-16}
CONCURRENCY=${CONCURRENCY:-4}
MAX_LEN=${MAX_LEN:-3000}
PROXY_HEALTH=${PROXY_HEALTH:-yes}
WAIT_SECS=${WAIT_SECS:-120}
case "$PROXY_HEALTH" in
  yes) proxy_flags=() ;;
  none) proxy_flags=(--completions-only) ;;
  *) echo "PROXY_HEALTH must be yes or none, not $PROXY_HEALTH"; exit 2 ;;
esac
PROFILE=${CARGO_PROFILE:-debug}
LOGDIR=${LOGDIR:-target/pd-example}
mkdir -p "$LOGDIR"

flag=""; [ "$PROFILE" = release ] && flag="--release"
cargo build -q $flag --examples
BIN=target/$PROFILE/examples

export VLLM_HOST_IP=127.0.0.1
export VLLM_MOONCAKE_BOOTSTRAP_PORT=$BOOTSTRAP_PORT
export RUST_LOG=${RUST_LOG:-info}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_health() { # url name pid
  for _ in $(seq 1 240); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$3" 2>/dev/null; then echo "$2 exited; log:"; tail -20 "$LOGDIR/$2.log"; return 1; fi
    sleep 0.25
  done
  echo "$2 did not become healthy"; tail -20 "$LOGDIR/$2.log"; return 1
}

echo "starting prefill (TP $PREFILL_TP, PP $PREFILL_PP${MODEL_ARGS:+, $MODEL_ARGS}) on :$PREFILL_PORT, bootstrap :$BOOTSTRAP_PORT"
# shellcheck disable=SC2086
"$BIN/prefill" --port "$PREFILL_PORT" --tp "$PREFILL_TP" --pp "$PREFILL_PP" $MODEL_ARGS >"$LOGDIR/prefill.log" 2>&1 &
pids+=($!); prefill_pid=$!
echo "starting decode (TP $DECODE_TP, PP $DECODE_PP) on :$DECODE_PORT"
# shellcheck disable=SC2086
"$BIN/decode" --port "$DECODE_PORT" --tp "$DECODE_TP" --pp "$DECODE_PP" $MODEL_ARGS >"$LOGDIR/decode.log" 2>&1 &
pids+=($!); decode_pid=$!
wait_health "http://127.0.0.1:$PREFILL_PORT" prefill "$prefill_pid"
wait_health "http://127.0.0.1:$DECODE_PORT" decode "$decode_pid"
echo "starting proxy on :$PROXY_PORT${proxy_flags:+ (${proxy_flags[*]}: no /health, no /v1/models)}"
"$BIN/proxy" --port "$PROXY_PORT" --prefill "http://127.0.0.1:$PREFILL_PORT" "$BOOTSTRAP_PORT" \
  --decode "http://127.0.0.1:$DECODE_PORT" ${proxy_flags[@]+"${proxy_flags[@]}"} >"$LOGDIR/proxy.log" 2>&1 &
pids+=($!)

# Peak thread count of a process while the client runs (from /proc): the
# connector moves KV without a thread per transfer, so it should not grow
# with CONCURRENCY.
sample_threads() { # pid outfile
  local max=0 t
  while [ ! -e "$LOGDIR/.client-done" ] && kill -0 "$1" 2>/dev/null; do
    t=$(awk '/^Threads:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
    [ "${t:-0}" -gt "$max" ] && max=$t
    sleep 0.05
  done
  echo "$max" >"$2"
}
rm -f "$LOGDIR/.client-done"
sample_threads "$prefill_pid" "$LOGDIR/prefill.threads" & sampler1=$!
sample_threads "$decode_pid" "$LOGDIR/decode.threads" & sampler2=$!

client_rc=0
"$BIN/pd_client" --url "http://127.0.0.1:$PROXY_PORT" --requests "$REQUESTS" \
  --concurrency "$CONCURRENCY" --max-len "$MAX_LEN" --wait-secs "$WAIT_SECS" $MODEL_ARGS \
  | tee "$LOGDIR/client.log" || client_rc=$?
touch "$LOGDIR/.client-done"
if [ "$client_rc" != 0 ]; then
  wait "$sampler1" "$sampler2" || true
  echo "pd_client failed (exit $client_rc); proxy log:"; tail -20 "$LOGDIR/proxy.log"; exit 1
fi
# A readiness probe answered through the proxy is one more PD request.
probes=$(awk -F': ' '/^readiness probe completions:/{print $2}' "$LOGDIR/client.log")
probes=${probes:-0}
wait "$sampler1" "$sampler2" || true
echo "peak threads while the requests ran (concurrency $CONCURRENCY): prefill $(cat "$LOGDIR/prefill.threads"), decode $(cat "$LOGDIR/decode.threads")"
if [ -n "${MAX_THREADS:-}" ]; then
  read -r max_p max_d <<<"$MAX_THREADS"
  if [ "$(cat "$LOGDIR/prefill.threads")" -gt "$max_p" ] || [ "$(cat "$LOGDIR/decode.threads")" -gt "$max_d" ]; then
    echo "THREADS GREW with concurrency: limit prefill $max_p, decode $max_d"; exit 1
  fi
fi

# Every transfer must be accounted for on both sides, and the prefiller
# must have freed every block once the decoder pulled it.
for _ in $(seq 1 40); do
  pm=$(curl -sf "http://127.0.0.1:$PREFILL_PORT/metrics")
  held=$(echo "$pm" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests_holding_kv"])')
  [ "$held" = 0 ] && break
  sleep 0.25
done
dm=$(curl -sf "http://127.0.0.1:$DECODE_PORT/metrics")
python3 - "$pm" "$dm" "$((REQUESTS + probes))" "$PREFILL_TP" "$DECODE_TP" "$PREFILL_PP" "$DECODE_PP" <<'PY'
import json, sys
p, d = json.loads(sys.argv[1]), json.loads(sys.argv[2])
n, ptp, dtp, ppp, dpp = (int(x) for x in sys.argv[3:8])
pc, dc = p["connector"], d["connector"]
# Each prefill worker answers each decode worker it is paired with: TP
# ranks by vLLM's rule, PP stages one to one when the sizes match, else
# every stage with every stage (a stage sharing no layer answers at once).
pairs = max(ptp, dtp) * (ppp if ppp == dpp else ppp * dpp)
errors = []
if pc["transfers_ok"] != n * pairs: errors.append("prefill transfers_ok %d, want %d" % (pc["transfers_ok"], n * pairs))
if pc["transfers_failed"] or dc["pulls_failed"]: errors.append("failures: %s %s" % (pc["transfers_failed"], dc["pulls_failed"]))
if dc["pulls_ok"] != n * dtp * dpp: errors.append("decode pulls_ok %d, want %d" % (dc["pulls_ok"], n * dtp * dpp))
if pc["bytes_sent"] != dc["bytes_received"]: errors.append("prefill sent %d bytes, decode received %d" % (pc["bytes_sent"], dc["bytes_received"]))
if p["requests_holding_kv"] or p["blocks_free"] != p["blocks_total"]: errors.append("prefill still holds KV: %s" % p)
if d["blocks_free"] != d["blocks_total"]: errors.append("decode still holds blocks: %s" % d)
print("prefill: %d transfers, %d bytes, %d descriptors; decode: %d pulls, %d bytes" % (
    pc["transfers_ok"], pc["bytes_sent"], pc["descriptors_sent"], dc["pulls_ok"], dc["bytes_received"]))
if errors:
    print("METRICS MISMATCH: " + "; ".join(errors)); sys.exit(1)
PY
echo "run_pd_example: OK (prefill TP $PREFILL_TP PP $PREFILL_PP -> decode TP $DECODE_TP PP $DECODE_PP${MODEL_ARGS:+, $MODEL_ARGS}, proxy /health: $PROXY_HEALTH, $probes readiness probe request(s))"
