#!/usr/bin/env bash
# Starts a coordinator and WORKERS (default 2) CPU workers on loopback,
# creates the example job, prints the plan the coordinator computed, kills
# one worker to show the re-plan, and tears everything down. Logs go to
# LOG_DIR (default: a fresh folder under /tmp).
set -euo pipefail
cd "$(dirname "$0")/../.."
workers="${WORKERS:-2}"
log_dir="${LOG_DIR:-$(mktemp -d /tmp/muonps-demo-XXXXXX)}"
bazel build //server/coordinator:muonps-coordinator //server/worker:muonps-worker \
  //tools/muonps >/dev/null 2>&1
bin="$(bazel info bazel-bin 2>/dev/null)"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

bash deploy/local/make_credentials.sh "$log_dir/credentials"
export MUONPS_TOKEN_FILE="$log_dir/credentials/token" MUONPS_TLS_CA_FILE="$log_dir/credentials/ca.pem"
"$bin/server/coordinator/muonps-coordinator" --port 0 --metrics_port 0 \
  --tls_cert_file "$log_dir/credentials/server.pem" --tls_key_file "$log_dir/credentials/server.key" \
  --lease_ttl_ms 2000 --heartbeat_interval_ms 400 >"$log_dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  addr="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$log_dir/coordinator.log")"
  [[ -n "$addr" ]] && break
  sleep 0.1
done
[[ -n "$addr" ]] || { echo "coordinator did not start; see $log_dir" >&2; exit 1; }
echo "== coordinator on $addr (logs in $log_dir)"
"$bin/tools/muonps/muonps" create-job --coordinator "$addr" --spec examples/jobs/demo.json \
  --job_token_file "$log_dir/credentials/job-demo.token"
for i in $(seq 0 $((workers - 1))); do
  "$bin/server/worker/muonps-worker" --coordinator "$addr" --job demo --worker_id "w$i" \
    --socket "/tmp/muonps-demo-$$-w$i.sock" --metrics_port -1 \
    --memory_bytes $((8 << 30)) >"$log_dir/worker-w$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  n="$("$bin/tools/muonps/muonps" plan --coordinator "$addr" --job demo --json 2>/dev/null \
    | grep -c '"worker_id"' || true)"
  [[ "$n" -ge "$workers" ]] && break
  sleep 0.1
done
"$bin/tools/muonps/muonps" workers --coordinator "$addr" --job demo
"$bin/tools/muonps/muonps" plan --coordinator "$addr" --job demo
if ((workers > 1)); then
  echo "== kill -9 w0; the coordinator re-plans once its lease expires"
  kill -9 "${pids[1]}"
  wait "${pids[1]}" 2>/dev/null || true
  sleep 3
  "$bin/tools/muonps/muonps" plan --coordinator "$addr" --job demo | head -n $((7 + workers))
fi
