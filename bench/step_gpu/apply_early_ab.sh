#!/usr/bin/env bash
# The step on several GPUs with the workers applying updates before the
# votes (--apply_early=always, whatever the plan's clock chose) and at the
# commit (--apply_early=never),
# alternated in one lease, one build: for each of ROUNDS (2) rounds, run.sh
# (in this folder as run_step_gpu.sh) once each way, on GPUS (every visible
# GPU) and for each layout of LAYOUTS. One cost table measured first serves
# every run (COST_TABLE, or muonps-autotune once); the torch peers run in the
# first run only. JSON lines on stdout: run.sh's (the per-rank timelines
# included), each with "apply_early" (always or never) and "round" added; logs
# on stderr. Run on the GPU machine from a bundle of
# deploy/device/bundle_gpu_step.sh:
#   bash device_bundle/apply_early_ab.sh > ab.jsonl
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work="$(mktemp -d /tmp/apply-early-ab-XXXXXX)"
echo "apply_early_ab.sh: logs in $work" >&2
cost_table="${COST_TABLE:-}"
if [[ -z "$cost_table" ]]; then
  cost_table="$work/cost_table.jsonl"
  CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" timeout --kill-after=10 300 \
    "$here/bin/muonps-autotune" --backend cuda --precision bf16 \
    --shapes "${SHAPES:-4096x4096,1024x4096,14336x4096}" \
    --batches "${AUTOTUNE_BATCHES:-1,2,4,8,16}" --device 0 --out "$cost_table" \
    2>"$work/autotune.err" || { tail -5 "$work/autotune.err" >&2; exit 1; }
fi
failed=0
for ((round = 0; round < ${ROUNDS:-2}; round++)); do
  for early in always never; do
    peers=0
    [[ "$round" == 0 && "$early" == always ]] && peers="${OWNER_PEERS:-1}"
    echo "apply_early_ab.sh: round $round, --apply_early=$early" >&2
    ONE_GPU=0 OWNER_PEERS="$peers" COST_TABLE="$cost_table" \
      WORKER_ARGS="${WORKER_ARGS:-} --apply_early=$early" \
      bash "$here/run_step_gpu.sh" |
      python3 -c 'import json, sys
for line in sys.stdin:
    try: d = json.loads(line)
    except ValueError: continue
    d.update(apply_early=sys.argv[1], round=int(sys.argv[2]))
    print(json.dumps(d), flush=True)' "$early" "$round"
    ((PIPESTATUS[0] == 0)) || failed=1
  done
done
exit "$failed"
