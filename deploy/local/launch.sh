#!/usr/bin/env bash
# Local cluster: a coordinator, N workers and M trainer ranks on this
# machine (CPU), training the example MLP through muonps.
#
#   deploy/local/launch.sh [--workers N] [--trainers M] [--dedicated K]
#                          [--layout L] [--steps S] [--log_dir DIR]
#                          [--keep-running] [-- TRAINER FLAGS...]
#
# Waits for every process to be healthy, shows progress (step, loss, step
# time) from trainer rank 0, writes all logs to one folder, and tears
# everything down on exit or Ctrl-C. --keep-running stays up after training
# (printing the coordinator's address) until Ctrl-C. The coordinator keeps
# its state in the log folder on one port: if it exits it is started again
# there, and the workers and trainers reconnect. A worker that exits (a
# SIGTERM drains it first: its momentum moves to the others) is started
# again under its id, and its trainer attaches to it again. Trainers retry a
# step while its error is transient (mlp_trainer --step_retry_s) and save
# their state after every step (--state_file in the log folder): a trainer
# killed by a signal is started again and resumes from it, its parameters
# repaired by the workers when they committed a step it had not saved.
# The last line of output is one JSON object: initial_loss, final_loss,
# steps, layout, parity_max_rel_err (final parameters against a
# single-process run of the same kernels).
set -euo pipefail
cd "$(dirname "$0")/../.."

workers=2
dedicated=0
trainers=""
layout=unreduced
steps=50
log_dir=""
keep_running=0
trainer_flags=()
while (($#)); do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --trainers) trainers="$2"; shift 2 ;;
    --dedicated) dedicated="$2"; shift 2 ;;
    --layout) layout="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --log_dir) log_dir="$2"; shift 2 ;;
    --keep-running|--keep_running) keep_running=1; shift ;;
    --) shift; trainer_flags=("$@"); break ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "launch.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
trainers="${trainers:-$workers}"
case "$layout" in replicated|unreduced|row_sharded) ;; *)
  echo "launch.sh: --layout must be replicated, unreduced or row_sharded" >&2; exit 2 ;;
esac
if [[ "$trainers" != "$workers" ]]; then
  echo "launch.sh: the CPU data plane runs one trainer per worker (--trainers = --workers)" >&2
  exit 2
fi
log_dir="${log_dir:-$(mktemp -d /tmp/muonps-run-XXXXXX)}"
mkdir -p "$log_dir"
job="mlp-$$"

echo "== building (logs in $log_dir; a first build takes about 10 minutes on 2 cores)"
BUILD_LOG="$log_dir/build.log" bash deploy/local/build.sh \
  //server/coordinator:muonps-coordinator //server/worker:muonps-worker \
  //examples/trainer:mlp_trainer //tools/muonps || exit 1
bin="$(bazel info bazel-bin 2>/dev/null)"

pids=()
sockets=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -f "${sockets[@]}"
}
trap cleanup EXIT
trap 'echo; echo "== interrupted: stopping"; exit 130' INT TERM

wait_for() {  # wait_for FILE REGEX SECONDS -> prints capture
  local file="$1" regex="$2" deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    if [[ -f "$file" ]]; then
      local hit
      hit="$(sed -n "s/.*${regex}.*/\1/p" "$file" | head -n 1)"
      [[ -n "$hit" ]] && { echo "$hit"; return 0; }
    fi
    sleep 0.1
  done
  echo "launch.sh: timed out waiting for /$regex/ in $file" >&2
  tail -5 "$file" >&2 || true
  return 1
}

# Secured by default: a throwaway CA, the coordinator's certificate and a
# bearer token; every process below finds them through MUONPS_*.
credentials="$log_dir/credentials"
bash "$(dirname "$0")/make_credentials.sh" "$credentials"
export MUONPS_TOKEN_FILE="$credentials/token" MUONPS_TLS_CA_FILE="$credentials/ca.pem"
# One port for the cluster's life, and durable state: a coordinator started
# again comes back where everyone looks for it, with its jobs.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
coordinator_pid=""
start_coordinator() {
  "$bin/server/coordinator/muonps-coordinator" --host 127.0.0.1 --port "$port" --metrics_port 0 \
    --tls_cert_file "$credentials/server.pem" --tls_key_file "$credentials/server.key" \
    --state_dir "$log_dir/coordinator-state" \
    --lease_ttl_ms 3000 --heartbeat_interval_ms 500 >>"$log_dir/coordinator.log" 2>&1 &
  coordinator_pid=$!
  pids+=("$coordinator_pid")
}
# Starts the coordinator again if it exited (same port, same state).
watch_coordinator() {
  if ! kill -0 "$coordinator_pid" 2>/dev/null; then
    echo "== the coordinator exited; starting it again on $coordinator (see $log_dir/coordinator.log)"
    start_coordinator
  fi
}
start_coordinator
coordinator="$(wait_for "$log_dir/coordinator.log" 'listening on \([0-9.:]*\)' 20)"
echo "== coordinator on $coordinator (TLS, bearer token; credentials in $credentials)"

# Worker ids w0.. (one per trainer), then d0.. (dedicated: no trainer; they
# own matrices too, and the job waits for them).
worker_ids=()
for ((i = 0; i < workers; i++)); do worker_ids+=("w$i"); done
for ((i = 0; i < dedicated; i++)); do worker_ids+=("d$i"); done
declare -A worker_pid
start_worker() {  # start_worker ID
  local id="$1" extra=()
  [[ "$id" == d* ]] && extra=(--dedicated)
  sockets+=("/tmp/muonps-$$-$id.sock")
  "$bin/server/worker/muonps-worker" --coordinator "$coordinator" --job "$job" \
    --worker_id "$id" --socket "/tmp/muonps-$$-$id.sock" --metrics_port 0 --device cpu \
    --memory_bytes $((4 << 30)) ${extra[@]+"${extra[@]}"} >>"$log_dir/worker-$id.log" 2>&1 &
  worker_pid[$id]=$!
  pids+=($!)
}
# Starts a worker again if it exited (same id, socket and log).
watch_workers() {
  local id
  for id in "${worker_ids[@]}"; do
    if ! kill -0 "${worker_pid[$id]}" 2>/dev/null; then
      echo "== worker $id exited; starting it again (see $log_dir/worker-$id.log)"
      start_worker "$id"
    fi
  done
}
for id in "${worker_ids[@]}"; do start_worker "$id"; done
for ((i = 0; i < workers; i++)); do
  wait_for "$log_dir/worker-w$i.log" 'listening on unix:\(.*\)' 20 >/dev/null
done
for ((i = 0; i < dedicated; i++)); do
  wait_for "$log_dir/worker-d$i.log" 'listening on unix:\(.*\)' 20 >/dev/null
done
echo "== $workers workers up (and $dedicated dedicated)"

declare -A trainer_pid
start_trainer() {  # start_trainer RANK
  local r="$1"
  "$bin/examples/trainer/mlp_trainer" --coordinator "$coordinator" --job "$job" \
    --worker_socket "/tmp/muonps-$$-w$r.sock" --rank "$r" --ranks "$trainers" \
    --layout "$layout" --steps "$steps" --dedicated_workers "$dedicated" \
    --state_file "$log_dir/trainer-$r.state" \
    ${trainer_flags[@]+"${trainer_flags[@]}"} \
    >>"$log_dir/trainer-$r.log" 2>&1 &
  trainer_pid[$r]=$!
  pids+=($!)
}
# Trainers still running; one killed by a signal is started again (it
# resumes from its state file), one that failed ends the run.
trainers_left=$trainers
trainer_failed=0
watch_trainers() {
  local r rc
  for ((r = 0; r < trainers; r++)); do
    [[ -n "${trainer_pid[$r]}" ]] || continue
    kill -0 "${trainer_pid[$r]}" 2>/dev/null && continue
    rc=0
    wait "${trainer_pid[$r]}" || rc=$?
    trainer_pid[$r]=""
    if ((rc > 128)); then
      echo "== trainer $r was killed (signal $((rc - 128))); starting it again: it resumes from its saved state"
      start_trainer "$r"
    elif ((rc == 0)); then
      trainers_left=$((trainers_left - 1))
    else
      trainer_failed=1
      trainers_left=$((trainers_left - 1))
    fi
  done
}
# A state or log of an earlier job in this folder is not this one's.
for ((r = 0; r < trainers; r++)); do
  rm -f "$log_dir/trainer-$r.state"
  : >"$log_dir/trainer-$r.log"
  start_trainer "$r"
done

# Progress: trainer 0 prints one JSON object per step; each pass shows the
# new ones with one python3, so the loop below gets back to the processes
# within a fraction of a second however fast the steps go. It must: a
# trainer that ended has to be waited for before the kernel hands its pid to
# another child of this shell (pids wrap at 32768, in minutes on a busy
# machine), or bash forgets its exit status and the run ends as failed.
shown=0
show_progress() {
  local total
  total="$(grep -c '^{"step"' "$log_dir/trainer-0.log" 2>/dev/null || true)"
  total="${total:-0}"
  ((total > shown)) || return 0
  # sed reads to the end (a reader that stops early would fail grep with
  # SIGPIPE); a line still being written is shown as it is.
  grep '^{"step"' "$log_dir/trainer-0.log" | sed -n "$((shown + 1)),${total}p" |
    python3 -c 'import json,sys
for line in sys.stdin:
    try:
        d = json.loads(line)
        print("step %4d  loss after it %.6f  %7.1f ms  moved %d bytes" % (d["step"], d["loss"], d["step_ms"], d["bytes_moved"]))
    except (ValueError, KeyError, TypeError):
        print(line.rstrip())'
  shown=$total
}
while ((trainers_left > 0 && !trainer_failed)); do
  show_progress
  watch_coordinator
  watch_workers
  watch_trainers
  sleep 0.2
done
show_progress
if ((trainer_failed)); then
  echo "launch.sh: a trainer failed; see $log_dir" >&2
  for ((r = 0; r < trainers; r++)); do tail -3 "$log_dir/trainer-$r.log" >&2; done
  exit 1
fi
if ((keep_running)); then
  echo "== training done; the cluster stays up. coordinator: $coordinator"
  echo "   export MUONPS_TOKEN_FILE=$MUONPS_TOKEN_FILE MUONPS_TLS_CA_FILE=$MUONPS_TLS_CA_FILE"
  echo "   $bin/tools/muonps/muonps plan --coordinator $coordinator --job $job"
  echo "   grpcurl -cacert $MUONPS_TLS_CA_FILE -H \"authorization: Bearer \$(cat $MUONPS_TOKEN_FILE)\" \\"
  echo "       -d '{\"job\": \"$job\"}' $coordinator muonps.v1.Coordinator/GetPlan"
  echo "   Ctrl-C to stop."
  while true; do watch_coordinator; watch_workers; sleep 1; done
fi
grep '^{"initial_loss"' "$log_dir/trainer-0.log" | tail -n 1
