#!/usr/bin/env bash
# The local cluster (deploy/local/launch.sh) as a user runs it:
#  1. its coordinator killed (kill -9) mid-training: the launcher starts it
#     again on the same address from its state folder, the workers
#     reconnect;
#  2. a rolling restart: each worker stopped in turn (SIGTERM, as Kubernetes
#     stops a pod): it drains, handing its momentum over, and the launcher
#     starts it again;
#  3. 20 trainers killed (kill -9) at random moments, a random rank each
#     time: the launcher starts each again, it resumes from the state it
#     saved after its last answered step, and a step its worker committed
#     after that save is repaired from the other trainer.
# Each run finishes its steps (300; 2500 for the third) with parameters
# equal to a single-process run of the same kernels (parity 0). About six
# minutes on 2 cores once the binaries are built. Prints PASS/FAIL lines and ends with "N passed, M
# failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
passed=0
failed=0
check() {  # check NAME CONDITION-STATUS
  if [[ "$2" == 0 ]]; then echo "PASS $1"; passed=$((passed + 1));
  else echo "FAIL $1 (logs in $log_dir)"; failed=$((failed + 1)); fi
}
# A run of STEPS (300) steps on 2 workers and 2 trainers in the background,
# logging to a fresh $log_dir; $launcher is its pid and $deadline 600 s
# from now.
launch() {  # launch [STEPS]
  steps="${1:-300}"
  log_dir="$(mktemp -d /tmp/muonps-launcher-XXXXXX)"
  bash deploy/local/launch.sh --workers 2 --steps "$steps" --log_dir "$log_dir" \
    >"$log_dir/launch.out" 2>&1 &
  launcher=$!
  deadline=$((SECONDS + 600))
}
# Waits until trainer 0 printed step N (or the run ended, or the deadline).
wait_for_step() {  # wait_for_step N
  until grep -q "^{\"step\":$1," "$log_dir/trainer-0.log" 2>/dev/null; do
    if ((SECONDS > deadline)) || ! kill -0 "$launcher" 2>/dev/null; then break; fi
    sleep 0.2
  done
}
# The run's summary: every step, parameters equal to a single-process run.
check_parity() {  # check_parity THROUGH-WHAT
  local summary
  summary="$(tail -n 1 "$log_dir/launch.out")"
  echo "$summary"
  python3 - "$summary" "$steps" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if d.get("steps") == int(sys.argv[2]) and d.get("parity_max_rel_err") == 0 else 1)
PY
  check "$steps steps through $1, parameters equal to a single-process run" $?
}

# 1. The coordinator killed once training is under way.
launch
wait_for_step 20
victim="$(pgrep -f -- "--state_dir $log_dir/coordinator-state" | head -n 1)"
if [[ -n "$victim" ]]; then
  kill -9 "$victim"
  check "coordinator killed with kill -9 at step 20 (pid $victim)" 0
else
  check "a coordinator with --state_dir was running at step 20" 1
fi
wait "$launcher"
rc=$?
check "launch.sh finished training (exit $rc)" "$rc"
grep -q "the coordinator exited; starting it again" "$log_dir/launch.out"
check "the launcher started the coordinator again on the same address" $?
[[ "$(grep -c 'listening on' "$log_dir/coordinator.log")" -ge 2 ]]
check "the restarted coordinator listens again" $?
check_parity "the outage"
first="$(grep -o 'coordinator on [0-9.:]*' "$log_dir/launch.out" | head -n 1)"
last="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$log_dir/coordinator.log" | tail -n 1)"
[[ -n "$last" && "$first" == "coordinator on $last" ]]
check "the restarted coordinator is on the address the workers were given" $?

# 2. A rolling restart of the workers.
launch
for pair in w0:20 w1:120; do
  id="${pair%%:*}"
  at="${pair##*:}"
  wait_for_step "$at"
  victim="$(pgrep -f -- "--worker_id $id --socket /tmp/muonps-$launcher-" | head -n 1)"
  if [[ -n "$victim" ]]; then
    kill -TERM "$victim"
    while kill -0 "$victim" 2>/dev/null; do sleep 0.1; done
    check "worker $id stopped with SIGTERM at step $at (pid $victim)" 0
  else
    check "worker $id was running at step $at" 1
  fi
done
wait "$launcher"
rc=$?
check "launch.sh finished training through the rolling restart (exit $rc)" "$rc"
for id in w0 w1; do
  grep -q "worker=$id drained: step" "$log_dir/worker-$id.log"
  check "worker $id drained: its momentum went to the other worker before it left" $?
  [[ "$(grep -c "worker=$id listening on" "$log_dir/worker-$id.log")" -ge 2 ]]
  check "the launcher started worker $id again" $?
done
check_parity "a rolling restart"

# 3. Trainers killed at random moments, one fault at a time: a kill only
# once every trainer has run for 3 s, so the one killed before has resumed.
# The kills stall the job, but a fast machine runs the steps between them
# quickly: 600 steps ended after 19 kills once, and 1000 after 18 (108 s on
# 2 cores), so 2500. (Two trainers of an unreduced job killed within a step
# of each other can take that step's AdamW means with them: their workers
# then refuse the next step with DATA_LOSS, saying which state to reload;
# step_protocol_test covers it.)
launch 2500
wait_for_step 10
RANDOM=29
kills=0
while ((kills < 20)) && kill -0 "$launcher" 2>/dev/null && ((SECONDS < deadline)); do
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  rank=$((RANDOM % 2))
  victim="$(pgrep -f -- "mlp_trainer .*--worker_socket /tmp/muonps-$launcher-w$rank.sock" | head -n 1)"
  # Every trainer has had time to resume (a restarted one), so each kill is
  # a restart from a saved state while its peer runs.
  settled=0
  for t in $(pgrep -f -- "mlp_trainer .*--worker_socket /tmp/muonps-$launcher-w"); do
    [[ "$(ps -o etimes= -p "$t" 2>/dev/null)" -ge 3 ]] && settled=$((settled + 1))
  done
  # Both ranks' trainers are up, and have been for 3 s.
  [[ $settled == 2 ]] && settled=1 || settled=0
  [[ -n "$victim" && $settled == 1 ]] || continue
  kill -9 "$victim" && kills=$((kills + 1))
  sleep 1  # the launcher starts it again
done
check "20 trainers killed with kill -9 at random moments (killed $kills)" $((kills != 20))
wait "$launcher"
rc=$?
check "launch.sh finished training through the trainer kills (exit $rc)" "$rc"
resumed="$(cat "$log_dir"/trainer-*.log | grep -c 'resumed from')"
repaired="$(cat "$log_dir"/worker-*.log | grep -c 'repaired from')"
echo "trainers resumed: $resumed, of which repaired by their workers: $repaired"
[[ "$resumed" -eq "$kills" ]]
check "every killed trainer resumed from its saved state ($resumed)" $?
check_parity "20 trainer kills"

echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
