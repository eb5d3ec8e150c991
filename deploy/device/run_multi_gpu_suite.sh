#!/usr/bin/env bash
# The GPU data path on a machine of several GPUs, from
# the bundle of deploy/device/bundle_gpu_step.sh; every result goes to $OUT.
#   PHASES="tests"  every bundled GPU test (the two-GPU NCCL cases among
#                   them) and the Python package's multi-GPU cases (DDP over
#                   NCCL, FSDP2, torchrun with zero setup, train_gpt ranks)
#   PHASES="bench"  bench/step_gpu on 1 GPU and on $GPUS GPUs (each layout)
#                   with its torch peers in the same run
#   PHASES="gpt"    examples/train_gpt.py under torchrun on $GPUS GPUs, DDP
#                   and FSDP2, muonps.Muon against torch.optim.Muon and AdamW
#   PHASES="ddp_gpt" examples/ddp_gpt.py under torchrun on $GPUS GPUs (fp16
#                   GradScaler, torch.compile, deterministic kernels):
#                   muonps twice, resumed from rank 0's checkpoint after
#                   iteration 99, and torch.optim.Muon + AdamW on seeds 0
#                   and 1; ddp_gpt.json says which lines are equal
#   PHASES="gpt_iter" the iteration time of examples/ddp_gpt.py's 6-layer,
#                   384-wide GPT (32 K tokens an iteration, fp16, compiled)
#                   under DDP on $GPUS GPUs: AdamW, torch.optim.Muon + AdamW,
#                   muonps.Muon, and muonps.Muon under CUDA MPS (the
#                   trainer and its worker are two processes on one GPU);
#                   gpt_iter.jsonl has each one's median and the ratios
# GPUS defaults to every GPU the machine has. Usage (on the GPU machine):
#   tar -xJf device_bundle.tar.xz && PHASES="tests bench" \
#     bash device_bundle/run_multi_gpu_suite.sh
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export MUONPS_BIN_DIR="$here/bin"
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUONPS_LIB="$here/bin/libmuonps.so"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# The working tree's muonps package, and train_gpt's corpus for its tests.
export PYTHONPATH="$repo/client/python${PYTHONPATH:+:$PYTHONPATH}"
export MUONPS_CORPUS="$here/corpus.bin"
GPUS="${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -$((GPUS + 2)) || true
rc=0
for phase in ${PHASES:-tests bench gpt}; do
  case "$phase" in
    tests)
      echo "== GPU tests (GoogleTest)"
      timeout "${TESTS_TIMEOUT:-450}" bash "$here/run_gpu_tests.sh" >"$OUT/gtest.log" 2>&1 || rc=1
      grep -E '^\[  (PASSED|FAILED)|FAILED  \]|passed, .* failed|gpu_two_gpus_parity|gpu_two_workers_parity' "$OUT/gtest.log"
      echo "== Python: multi-GPU cases"
      timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider \
        "$repo/client/python/tests/test_ddp.py" "$repo/client/python/tests/test_fsdp.py" \
        "$repo/client/python/tests/test_train_gpt.py" "$repo/client/python/tests/test_torchrun.py" \
        -k "gpu or cuda or torchrun or two_ranks" >"$OUT/pytest.log" 2>&1 || rc=1
      grep -E 'passed|failed|error|rank [01] ' "$OUT/pytest.log" | tail -30
      ;;
    bench)
      echo "== bench/step_gpu, 1 and $GPUS GPUs"
      GPUS="$GPUS" timeout "${BENCH_TIMEOUT:-420}" bash "$here/run_step_gpu.sh" \
        >"$OUT/step.jsonl" 2>"$OUT/step.err" || { rc=1; tail -40 "$OUT/step.err"; }
      cat "$OUT/step.jsonl"
      ;;
    gpt)
      echo "== examples/train_gpt.py on $GPUS GPUs (torchrun)"
      for parallel in ${PARALLEL:-ddp fsdp}; do
        timeout "${GPT_TIMEOUT:-240}" python3 -m torch.distributed.run --standalone \
          --nproc-per-node "$GPUS" "$repo/examples/train_gpt.py" \
          --corpus "$here/corpus.bin" --parallel "$parallel" \
          --optimizers "${OPTIMIZERS:-muonps,torch_muon,adamw}" --seeds 0 \
          --steps "${STEPS:-150}" --eval_every 50 \
          --out "$OUT/gpt-$parallel.jsonl" >"$OUT/gpt-$parallel.log" 2>&1 || rc=1
        grep -E 'step (0|49|99|149|199):|Error|error' "$OUT/gpt-$parallel.log" | head -30
      done
      ;;
    ddp_gpt)
      echo "== examples/ddp_gpt.py on $GPUS GPUs (torchrun)"
      common=(--device cuda --dtype float16 --compile --deterministic
              --iters 200 --width 256 --layers 4 --heads 4 --context 64
              --batch 32 --lr 3e-3 --warmup 10)
      ddp_run() {  # NAME ARGS...
        local name="$1"; shift
        timeout "${GPT_TIMEOUT:-240}" python3 -m torch.distributed.run --standalone \
          --nproc-per-node "$GPUS" "$repo/examples/ddp_gpt.py" "${common[@]}" \
          --out "$OUT/ddp-gpt-$name.jsonl" "$@" >"$OUT/ddp-gpt-$name.log" 2>&1
        echo "$name rc=$? $(tail -n 1 "$OUT/ddp-gpt-$name.jsonl" 2>/dev/null)"
      }
      ddp_run muonps --save_every 100 --checkpoint "$OUT/ddp-ckpt{iter}.pt" || rc=1
      ddp_run muonps-again || rc=1
      ddp_run muonps-resumed --resume "$OUT/ddp-ckpt99.pt" || rc=1
      ddp_run torch --optimizer torch || rc=1
      ddp_run torch-seed1 --optimizer torch --seed 1 || rc=1
      rm -f "$OUT"/ddp-ckpt*.pt
      grep -h "muonps: routing\|Muon gets\|AdamW gets" "$OUT/ddp-gpt-muonps.log" | head -4
      python3 - "$OUT" <<'PY' | tee "$OUT/ddp_gpt.json"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def losses(name):
    return {json.loads(l)["iter"]: json.loads(l)["loss"]
            for l in (out / f"ddp-gpt-{name}.jsonl").read_text().splitlines()}
a, again, resumed = losses("muonps"), losses("muonps-again"), losses("muonps-resumed")
torch0, torch1 = losses("torch"), losses("torch-seed1")
last = max(a)
def tail(d):  # the last 20 iterations' mean: less noisy than one batch
    return sum(d[i] for i in range(last - 19, last + 1)) / 20
print(json.dumps({
    "iters": len(a), "repeat_bit_identical": a == again,
    "resume_first_iter": min(resumed),
    "resume_bit_identical": all(resumed[i] == a[i] for i in resumed),
    "resume_max_abs_diff": max(abs(resumed[i] - a[i]) for i in resumed),
    "final_loss_muonps": a[last], "final_loss_torch": torch0[last],
    "final_loss_torch_seed1": torch1[last],
    "muonps_minus_torch": a[last] - torch0[last],
    "torch_seed_spread": torch1[last] - torch0[last],
    "tail20_muonps": tail(a), "tail20_torch": tail(torch0),
    "tail20_torch_seed1": tail(torch1)}))
PY
      ;;
    gpt_iter)
      echo "== examples/ddp_gpt.py iteration time on $GPUS GPUs (torchrun)"
      iter_args=(--device cuda --dtype float16 --compile --iters "${ITERS:-150}"
                 --width 384 --layers 6 --heads 6 --context 256 --batch 64
                 --accum 2 --lr 3e-3 --warmup 10)
      iter_run() {  # NAME ARGS...
        local name="$1"; shift
        rm -f "$OUT/gpt-iter-$name.jsonl"
        timeout "${GPT_TIMEOUT:-300}" python3 -m torch.distributed.run --standalone \
          --nproc-per-node "$GPUS" "$repo/examples/ddp_gpt.py" "${iter_args[@]}" \
          --out "$OUT/gpt-iter-$name.jsonl" "$@" >"$OUT/gpt-iter-$name.log" 2>&1
        echo "$name rc=$? $(tail -n 1 "$OUT/gpt-iter-$name.jsonl" 2>/dev/null)"
      }
      iter_run adamw --optimizer adamw || rc=1
      iter_run torch --optimizer torch || rc=1
      iter_run muonps || rc=1
      if nvidia-cuda-mps-control -d 2>/dev/null; then
        iter_run muonps-mps || rc=1
        echo quit | nvidia-cuda-mps-control
      fi
      python3 - "$OUT" "$GPUS" <<'PY' | tee "$OUT/gpt_iter.jsonl"
import json, pathlib, statistics, sys
out, gpus = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def run(name):
    path = out / f"gpt-iter-{name}.jsonl"
    if not path.exists():
        return None
    lines = [json.loads(l) for l in path.read_text().splitlines()]
    timed = [l["ms"] for l in lines if l["iter"] >= 20]  # after compiling
    return {"iters": len(lines), "median_ms": statistics.median(timed),
            "final_loss": lines[-1]["loss"]} if timed else None
runs = {n: run(n) for n in ("adamw", "torch", "muonps", "muonps-mps")}
for name, r in runs.items():
    if r is not None:
        print(json.dumps({"what": "ddp_gpt_iteration", "optimizer": name,
                          "gpus": gpus, "width": 384, "layers": 6,
                          "tokens_per_iteration": 32768, **r}))
if runs["adamw"] and runs["muonps"] and runs["torch"]:
    a, t, m = (runs[n]["median_ms"] for n in ("adamw", "torch", "muonps"))
    print(json.dumps({"what": "ddp_gpt_iteration_ratios", "gpus": gpus,
                      "muonps_over_adamw": m / a, "muonps_over_torch_muon": m / t,
                      "torch_muon_over_adamw": t / a}))
PY
      ;;
    *) echo "unknown phase $phase" >&2; rc=2 ;;
  esac
done
exit $rc
