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
      timeout "${TESTS_TIMEOUT:-300}" bash "$here/run_gpu_tests.sh" >"$OUT/gtest.log" 2>&1 || rc=1
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
    *) echo "unknown phase $phase" >&2; rc=2 ;;
  esac
done
exit $rc
