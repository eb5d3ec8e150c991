#!/usr/bin/env bash
# The one-GPU muonps step of two builds, alternated in one lease: for each
# of ROUNDS (2) rounds, each bundle's coordinator, muonps-worker --device
# cuda:0 and step_gpu_bench (no torch peers, no autotune: the workers plan
# by the FLOP model, the same for both), then the worker's last step
# timeline. For an A/B of a worker change on one GPU with little device
# time. Run from the repository root on the GPU machine:
#   bash bench/step_gpu/one_gpu_ab.sh A.tar.xz B.tar.xz > ab.jsonl
# (bundles of deploy/device/bundle_gpu_step.sh). JSON lines on stdout, each
# with "bundle" (0: A, 1: B) and "round" added; the timelines as muonps_step_timeline
# lines; logs on stderr.
set -uo pipefail
(($# == 2)) || { echo "usage: one_gpu_ab.sh A.tar.xz B.tar.xz" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
work="$(mktemp -d /tmp/one-gpu-ab-XXXXXX)"
echo "one_gpu_ab.sh: logs in $work" >&2
for i in 0 1; do
  mkdir -p "$work/b$i"
  tar -xJf "${@:$((i + 1)):1}" -C "$work/b$i" || exit 2
done
run_one() {  # run_one INDEX ROUND
  local b="$work/b$1/device_bundle" logs="$work/run-$1-$2" coordinator cp wp
  mkdir -p "$logs"
  export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:$nccl_lib"
  (umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' >"$logs/token")
  export MUONPS_TOKEN_FILE="$logs/token"
  "$b/bin/muonps-coordinator" --port 0 --metrics_port -1 --insecure >"$logs/c.log" 2>&1 &
  cp=$!
  for _ in $(seq 200); do grep -q "listening on" "$logs/c.log" && break; sleep 0.1; done
  coordinator="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$logs/c.log" | head -1)"
  "$b/bin/muonps-worker" --coordinator "$coordinator" --job ab --worker_id w0 \
    --socket "$logs/w0.sock" --metrics_port -1 --device cuda:0 --io_timeout_ms 60000 \
    --log_level debug >"$logs/w.log" 2>&1 &
  wp=$!
  for _ in $(seq 600); do grep -q "listening on unix" "$logs/w.log" && break; sleep 0.1; done
  timeout --kill-after=10 "${BENCH_TIMEOUT:-150}" "$b/bin/step_gpu_bench" \
    --coordinator "$coordinator" --job ab --worker_socket "$logs/w0.sock" --layers "${LAYERS:-8}" \
    --set "${SET:-llama}" 2>"$logs/bench.err" |
    python3 -c 'import json, sys
for line in sys.stdin:
    try: d = json.loads(line)
    except ValueError: continue
    d.update(bundle=int(sys.argv[1]), round=int(sys.argv[2])); print(json.dumps(d))' "$1" "$2"
  sed -n 's/.*step timeline \({.*}\)$/\1/p' "$logs/w.log" | tail -1 |
    python3 -c 'import json, sys
for line in sys.stdin:
    d = {"what": "muonps_step_timeline", "bundle": int(sys.argv[1]), "round": int(sys.argv[2])}
    d.update(json.loads(line)); print(json.dumps(d))' "$1" "$2"
  kill "$wp" "$cp" 2>/dev/null
  wait "$wp" "$cp" 2>/dev/null
}
for ((round = 0; round < ${ROUNDS:-2}; round++)); do
  run_one 0 "$round"
  run_one 1 "$round"
done
