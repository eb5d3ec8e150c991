#!/usr/bin/env bash
# bench/step_gpu on the GPU machine, in one run: the PyTorch peers first
# (fused AdamW, torch.optim.Muon, bf16 GEMM; torch_peers.py --skip_ns), then
# a muonps-coordinator and a muonps-worker --device cuda:0 and the
# step_gpu_bench trainer against them. With GPUS=N > 1 (default: every
# visible GPU), then the torch owner-based Muon and all-reduce peers on N
# GPUs (torch_peers.py --owner_world N), and per layout in
# ${LAYOUTS:-replicated unreduced row_sharded} a fresh coordinator, N
# workers (--device cuda:w --gpu_transport nccl, each with its own socket
# and loopback /metrics) and N step_gpu_bench ranks started together. With
# one GPU (or IPC_VARIANT=1) two trainers and two workers also share GPU 0
# over CUDA IPC. JSON lines on stdout (torch's, then muonps's); logs and
# progress on stderr and under a /tmp/step-gpu-* folder. Every wait is
# bounded; a failure prints the log tails of the processes involved. Run
# from a bundle made by deploy/device/bundle_gpu_step.sh (bin/, lib/, this
# script, torch_peers.py).
#   GPUS, LAYOUTS, LAYERS (8), SET (llama), EXPERTS (64), ONE_GPU (1), MULTI_WARMUP (2), MULTI_REPEATS
#   (8), BENCH_TIMEOUT (240 s
#   per bench run), TORCH_TIMEOUT (300 s per torch_peers.py run),
#   TRANSPORT (nccl or ipc: the workers' --gpu_transport on N GPUs),
#   DEDICATED (0: the last DEDICATED of the N workers get no trainer, a
#   dedicated optimizer pool), OWNER_PEERS (1: 0 skips the torch peers on
#   N GPUs), COST_TABLE (a cost table file for every worker; by default
#   muonps-autotune measures one on GPU 0 first, for the set's shapes;
#   AUTOTUNE=0 gives the workers none, so the planner uses its FLOP model),
#   AUTOTUNE_BATCHES (1,2,4,8,16, and the set's largest stack),
#   WORKER_ARGS (more flags for the workers, e.g. --peer_writes=false to
#   broadcast updates over the transport instead of writing them into the
#   peers' staging, or --apply_early=never to apply every update at the
#   commit), COORDINATOR_ARGS (more flags for the coordinators,
#   e.g. --rebalance_tolerance=0 to keep the plans of the cost table when
#   the GPUs measure unequal).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
logs="$(mktemp -d /tmp/step-gpu-XXXXXX)"
echo "run.sh: logs in $logs" >&2
torch_results="$logs/torch.jsonl"
bench_timeout="${BENCH_TIMEOUT:-240}"
torch_timeout="${TORCH_TIMEOUT:-300}"
# LAYERS: layers of the set (8: the 1.74 B Llama set; 32: all of it; 12
# for gpt2).
# SET: llama, gpt2 (GPT-2-small blocks: a small step, where the fixed costs
# show) or moe (DeepSeek-V3-like MoE layers of EXPERTS routed experts, 64 by
# default; bench/step_gpu/llama_matrices.h).
default_layers=8
[[ "${SET:-llama}" == gpt2 ]] && default_layers=12
layers="${LAYERS:-$default_layers}"
set_args=(--set "${SET:-llama}" --experts "${EXPERTS:-64}")
if [[ -z "${GPUS:-}" ]]; then
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    GPUS="$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c . || true)"
  else
    GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  fi
fi
GPUS="${GPUS:-1}"
((GPUS >= 1)) || GPUS=1
echo "run.sh: GPUS=$GPUS" >&2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
if [[ "${ONE_GPU:-1}" == 1 ]]; then
timeout --kill-after=10 "$torch_timeout" \
  python3 "$here/torch_peers.py" --skip_ns --out "$torch_results" --layers "$layers" "${set_args[@]}" "${@}"
fi
# The device's measured Newton-Schulz costs, which every worker hands the
# coordinator's planner (--cost_table): the plan balances the workers by
# them and splits a batch where the autotuner found that faster.
cost_table="${COST_TABLE:-}"
if [[ -z "$cost_table" && "${AUTOTUNE:-1}" == 1 ]]; then
  case "${SET:-llama}" in
    moe) shapes="1536x7168,24576x1536,576x7168,32768x512,7168x16384,2048x7168"
         largest=$((layers * ${EXPERTS:-64})) ;;
    gpt2) shapes="2304x768,768x768,3072x768"; largest="$layers" ;;
    *) shapes="4096x4096,1024x4096,14336x4096"; largest=$((layers * 2)) ;;
  esac
  batches="${AUTOTUNE_BATCHES:-1,2,4,8,16}"
  ((largest > 16)) && [[ -z "${AUTOTUNE_BATCHES:-}" ]] && batches+=",$largest"
  cost_table="$logs/cost_table.jsonl"
  echo "run.sh: muonps-autotune on GPU 0 ($shapes; batches $batches)" >&2
  CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" timeout --kill-after=10 300 \
    "$here/bin/muonps-autotune" --backend cuda --precision bf16 --shapes "$shapes" \
    --batches "$batches" --device 0 --out "$cost_table" 2>"$logs/autotune.err" \
    || { tail -5 "$logs/autotune.err" >&2; exit 1; }
fi
cost_args=()
[[ -n "$cost_table" ]] && cost_args=(--cost_table "$cost_table")

# A fresh bearer token, as a private service has (plaintext on loopback).
(umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' >"$logs/token")
export MUONPS_TOKEN_FILE="$logs/token"

pids=()
# Stops every process started (SIGTERM, then SIGKILL after 15 s).
stop_all() {
  local p
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 150); do
    local alive=0
    for p in "${pids[@]+"${pids[@]}"}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${pids[@]+"${pids[@]}"}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap stop_all EXIT
# wait_for LOG PATTERN SECONDS PID: until LOG holds PATTERN; fails (with the
# log's tail) when PID exits first or the time runs out.
wait_for() {
  local log="$1" pattern="$2" seconds="$3" pid="$4"
  for _ in $(seq $((seconds * 10))); do
    grep -q "$pattern" "$log" 2>/dev/null && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "run.sh: $log: its process exited before \"$pattern\"; its tail:" >&2
      tail -30 "$log" >&2 || true
      return 1
    fi
    sleep 0.1
  done
  echo "run.sh: $log: no \"$pattern\" after ${seconds} s; its tail:" >&2
  tail -30 "$log" >&2 || true
  return 1
}
# start_coordinator LOG: sets $coordinator to its HOST:PORT.
start_coordinator() {
  # shellcheck disable=SC2086 # COORDINATOR_ARGS: several flags
  "$here/bin/muonps-coordinator" --port 0 --metrics_port -1 --insecure \
    ${COORDINATOR_ARGS:-} >"$1" 2>&1 &
  pids+=($!)
  wait_for "$1" "listening on" 20 "$!"
  coordinator="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$1" | head -1)"
}
# timeline LOG LAYOUT GPUS [WORKERS]: the worker's device timeline of its
# last step (its debug log, CUDA events: when each bucket's transfers and
# each stack's compute were done) as a muonps_step_timeline line; WORKERS
# where several share the GPUS.
timeline() {
  local workers=""
  [[ -n "${4:-}" ]] && workers="\"workers\":$4,"
  sed -n 's/.*step timeline \({.*}\)$/\1/p' "$1" | tail -1 |
    sed "s/^{/{\"what\":\"muonps_step_timeline\",\"layout\":\"$2\",\"gpus\":$3,$workers/"
}
# tails FILE...: the last lines of each log, on stderr.
tails() {
  local f
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    echo "---- tail of $f" >&2
    tail -25 "$f" >&2 || true
  done
}

# ONE_GPU=0 skips the one-GPU runs (and the ratios to them): for trying
# settings of the multi-GPU runs quickly.
if [[ "${ONE_GPU:-1}" == 1 ]]; then
start_coordinator "$logs/coordinator.log"
"$here/bin/muonps-worker" --coordinator "$coordinator" --job step-gpu --worker_id w0 \
  --socket "$logs/w0.sock" --metrics_port -1 --device cuda:0 --io_timeout_ms 60000 \
  "${cost_args[@]+"${cost_args[@]}"}" --log_level debug ${WORKER_ARGS:-} \
  >"$logs/worker.log" 2>&1 &
pids+=($!)
wait_for "$logs/worker.log" "listening on unix" 60 "$!"
timeout --kill-after=10 "$bench_timeout" \
  "$here/bin/step_gpu_bench" --coordinator "$coordinator" --worker_socket "$logs/w0.sock" --layers "$layers" "${set_args[@]}" \
  --torch_results "$torch_results" | tee "$logs/one.jsonl" || { tail -20 "$logs/worker.log" >&2; exit 1; }
timeline "$logs/worker.log" replicated 1
stop_all
fi
touch "$torch_results" "$logs/one.jsonl"

if [[ "${ONE_GPU:-1}" == 1 ]] && { ((GPUS == 1)) || [[ "${IPC_VARIANT:-0}" == 1 ]]; }; then
  # Two trainers and two workers sharing the GPU (CUDA IPC peer transport).
  start_coordinator "$logs/coordinator2.log"
  for w in 0 1; do
    "$here/bin/muonps-worker" --coordinator "$coordinator" --job step-gpu2 --worker_id "v$w" \
      --socket "$logs/v$w.sock" --metrics_port -1 --device cuda:0 --gpu_transport ipc \
      "${cost_args[@]+"${cost_args[@]}"}" --log_level debug \
      --io_timeout_ms 60000 >"$logs/worker-v$w.log" 2>&1 &
    pids+=($!)
    wait_for "$logs/worker-v$w.log" "listening on unix" 60 "$!"
  done
  timeout --kill-after=10 "$bench_timeout" \
    "$here/bin/step_gpu_bench" --coordinator "$coordinator" --job step-gpu2 \
    --layers "$layers" "${set_args[@]}" \
    --worker_sockets "$logs/v0.sock,$logs/v1.sock" --torch_results "$torch_results" \
    --one_worker_results "$logs/one.jsonl" || { tail -20 "$logs/worker-v0.log" >&2; exit 1; }
  for w in 0 1; do timeline "$logs/worker-v$w.log" replicated 1 2; done
  stop_all
fi
((GPUS > 1)) || exit 0

# N GPUs: the torch peers, then muonps per layout.
failed=0
dedicated="${DEDICATED:-0}"
transport="${TRANSPORT:-nccl}"
trainers=$((GPUS - dedicated))
((trainers >= 1)) || { echo "run.sh: DEDICATED=$dedicated leaves no trainer on $GPUS GPUs" >&2; exit 2; }
echo "run.sh: $GPUS workers over $transport, $trainers with a trainer" >&2
if [[ "${OWNER_PEERS:-1}" == 1 ]]; then
echo "run.sh: torch owner-based Muon and all-reduce on $trainers GPUs" >&2
timeout --kill-after=10 "$torch_timeout" \
  python3 "$here/torch_peers.py" --owner_world "$trainers" --out "$torch_results" --layers "$layers" "${set_args[@]}" \
  --warmup 2 --owner_repeats 7 \
  || { echo "run.sh: torch_peers.py --owner_world $trainers failed (rc $?); muonps runs on, its ratios null" >&2; failed=1; }
fi

# run_layout LAYOUT: coordinator, $GPUS workers, $trainers bench ranks.
run_layout() {
  local layout="$1" dir="$logs/$1" w r p
  mkdir -p "$dir"
  echo "run.sh: muonps on $GPUS GPUs, layout $layout (logs in $dir)" >&2
  start_coordinator "$dir/coordinator.log" || return 1
  local metrics=() workers=()
  for ((w = 0; w < GPUS; w++)); do
    local role=()
    ((w >= trainers)) && role=(--dedicated)
    "$here/bin/muonps-worker" --coordinator "$coordinator" --job "step-gpu-$layout" \
      --worker_id "w$w" --socket "$dir/w$w.sock" --device "cuda:$w" --gpu_transport "$transport" \
      --metrics_address 127.0.0.1:0 --metrics_port 0 --io_timeout_ms 60000 \
      "${role[@]+"${role[@]}"}" "${cost_args[@]+"${cost_args[@]}"}" \
      ${WORKER_ARGS:-} --log_level debug >"$dir/worker$w.log" 2>&1 &
    pids+=($!)
    workers+=($!)
  done
  for ((w = 0; w < GPUS; w++)); do
    wait_for "$dir/worker$w.log" "listening on unix" 60 "${workers[$w]}" || return 1
    wait_for "$dir/worker$w.log" "metrics on http://" 10 "${workers[$w]}" || return 1
    metrics+=("$(sed -n 's#.*metrics on http://\([0-9.:]*\)/metrics.*#\1#p' "$dir/worker$w.log" | head -1)")
  done
  local list
  list="$(IFS=,; echo "${metrics[*]}")"
  echo "run.sh: workers' metrics at $list" >&2
  local benches=()
  for ((r = 0; r < trainers; r++)); do
    local extra=()
    ((r == 0)) && extra=(--worker_metrics "$list")
    timeout --kill-after=10 "$bench_timeout" \
      "$here/bin/step_gpu_bench" --coordinator "$coordinator" --job "step-gpu-$layout" --layers "$layers" "${set_args[@]}" \
      --worker_socket "$dir/w$r.sock" --rank "$r" --ranks "$trainers" --layout "$layout" \
      --dedicated_workers "$dedicated" \
      --warmup "${MULTI_WARMUP:-2}" --repeats "${MULTI_REPEATS:-8}" \
      --torch_results "$torch_results" --one_worker_results "$logs/one.jsonl" \
      "${extra[@]+"${extra[@]}"}" >"$dir/bench$r.jsonl" 2>"$dir/bench$r.err" &
    benches+=($!)
  done
  # All ranks, bounded; the first failure stops the others (they would wait
  # for it until their timeout).
  local bad=0 left
  while :; do
    left=0
    for ((r = 0; r < trainers; r++)); do
      p="${benches[$r]}"
      [[ "$p" == finished ]] && continue
      if kill -0 "$p" 2>/dev/null; then
        left=1
      else
        if wait "$p"; then :; else
          echo "run.sh: $layout: bench rank $r exited with $? (124: timed out after $bench_timeout s)" >&2
          bad=1
        fi
        benches[$r]=finished
      fi
    done
    ((left)) || break
    if ((bad)); then
      for p in "${benches[@]}"; do [[ "$p" == finished ]] || kill "$p" 2>/dev/null || true; done
    fi
    sleep 0.2
  done
  # Every line says how many workers ran it, and over which transport.
  for ((r = 0; r < trainers; r++)); do
    sed "s/}\$/,\"workers\":$GPUS,\"transport\":\"$transport\"}/" "$dir/bench$r.jsonl"
  done
  # Each worker's device timeline of its last step.
  for ((w = 0; w < GPUS; w++)); do timeline "$dir/worker$w.log" "$layout" "$GPUS"; done
  if ((bad)); then
    local files=("$dir/coordinator.log")
    for ((r = 0; r < trainers; r++)); do files+=("$dir/bench$r.err"); done
    for ((w = 0; w < GPUS; w++)); do files+=("$dir/worker$w.log"); done
    tails "${files[@]}"
  else
    for ((r = 0; r < trainers; r++)); do tail -3 "$dir/bench$r.err" >&2 || true; done
  fi
  stop_all
  return "$bad"
}

for layout in ${LAYOUTS:-replicated unreduced row_sharded}; do
  run_layout "$layout" || { failed=1; stop_all; }
done
exit "$failed"
