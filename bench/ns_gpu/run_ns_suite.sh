#!/usr/bin/env bash
# The Newton-Schulz GPU run in one command, from a bundle made by bundle_ns_suite.sh:
# bench/ns_gpu against its torch peers (PHASES has "bench"; LT=1 adds the
# cuBLAS-tile bench, --lt_tiles=false, beside the default cuBLASLt one), ns_gpu_timing's plan,
# restart-schedule and AOL variants with the cuBLASLt search figures
# ("timing"), the CUDA NS tests and golden replay per precision and
# algorithm ("tests"), and an ncu profile of one eager Llama-set pass
# ("ncu"). Each phase has its own timeout; results go to $OUT as they come.
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
PHASES="${PHASES:-bench timing tests ncu}"
T="$(mktemp -d)"
mkdir -p "$OUT"
E="$OUT/errors.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit \
  --format=csv,noheader
has() { [[ " $PHASES " == *" $1 "* ]]; }
if has bench; then
  echo "== bench/ns_gpu"
  timeout 150 python3 "$B/torch_peers.py" --out "$T/torch.jsonl" \
    >"$OUT/bench.jsonl" 2>>"$E"
  echo "torch peers rc=$?"
  timeout 60 "$B/bin/ns_gpu_bench" --torch_results "$T/torch.jsonl" \
    >>"$OUT/bench.jsonl" 2>>"$E"
  echo "bench rc=$?"
  grep -E '"what":"(muonps_ns_all|muonps_update_1gpu)"' "$OUT/bench.jsonl"
  if [[ "${LT:-0}" == 1 ]]; then
    timeout 60 "$B/bin/ns_gpu_bench" --torch_results "$T/torch.jsonl" \
      --lt_tiles=false >"$OUT/bench_lt.jsonl" 2>>"$E"
    echo "bench cublas tiles rc=$?"
    grep -E '"what":"(muonps_ns_all|muonps_update_1gpu)"' "$OUT/bench_lt.jsonl"
  fi
fi
if has timing; then
  echo "== ns_gpu_timing"
  timeout 100 "$B/bin/ns_gpu_timing" --repeats=3 ${TIMING_ONLY:+--only=$TIMING_ONLY} \
    >"$OUT/timing.jsonl" 2>>"$E"
  echo "timing rc=$?"
  grep -v '^{' "$OUT/timing.jsonl"
fi
if has tests; then
  echo "== tests"
  for t in ${TESTS:-lt_gemm_gpu_test ns_plans_gpu_test ns_accuracy_gpu_test cuda_kernels_ns_gpu_test cuda_kernels_step_gpu_test cuda_kernels_streams_gpu_test cuda_kernels_test elementwise_gpu_test}; do
    [[ -x "$B/bin/$t" ]] || continue
    timeout 100 "$B/bin/$t" >"$T/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$T/$t.log" | tr '\n' ' ')"
    { echo "== $t"; cat "$T/$t.log"; } >>"$OUT/tests.log"
  done
  grep -E "rank-deficient .* max|aol bf16|FAILED|Failure|Expected|Which is" \
    "$OUT/tests.log" | head -30
  for p in ${GOLDEN:-fp32 bf16 fp16}; do
    for a in ns5 gram; do
      echo "== golden_replay $p $a" >>"$OUT/tests.log"
      timeout 30 "$B/bin/golden_replay" --golden "$B/golden" --backend cuda \
        --precision "$p" --algorithm "$a" >>"$OUT/tests.log" 2>&1
      echo "golden $p $a rc=$? $(tail -n1 "$OUT/tests.log")"
    done
  done
fi
if has ncu; then
  echo "== ncu"
  ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  echo "ncu at: ${ncu_bin:-none}"
  if [[ -n "$ncu_bin" ]]; then
    # The kernels of one eager pass of the Llama set (the second of two:
    # the first, about 150 launches, is the warm-up), Speed of Light each.
    timeout "${NCU_TIMEOUT:-120}" "$ncu_bin" --clock-control none \
      --launch-skip "${NCU_SKIP:-150}" --launch-count "${NCU_COUNT:-170}" \
      --section SpeedOfLight --csv --page details \
      "$B/bin/ns_gpu_timing" --micro=false --repeats=1 \
      --only="${NCU_VARIANT:-bf16_tiles16_nographs}" >"$OUT/ncu.csv" 2>>"$E"
    echo "ncu rc=$? $(wc -l <"$OUT/ncu.csv") lines"
  fi
fi
