#!/usr/bin/env bash
# The CUDA backend's verification on the GPU machine, from a bundle made by
# bundle_gpu_suite.sh: GPU tests, golden replay for every precision and
# algorithm, bench/ns_gpu against its torch peers, the autotuner's cost
# table, and (NCU=1) an ncu profile of the hot kernels. Results go to $OUT.
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "== tests"
timeout 300 bash "$B/run_gpu_tests.sh" >"$OUT/tests.log" 2>&1
echo "tests rc=$? $(tail -n1 "$OUT/tests.log")"
echo "== golden replay"
for p in fp32 bf16 fp16; do
  for a in ns5 gram; do
    echo "-- $p $a" >>"$OUT/golden.log"
    timeout 60 "$B/bin/golden_replay" --golden "$B/golden" --backend cuda \
      --precision "$p" --algorithm "$a" >>"$OUT/golden.log" 2>&1
    echo "golden $p $a rc=$? $(tail -n1 "$OUT/golden.log")"
  done
done
echo "== bench/ns_gpu"
(cd "$B" && TORCH_RESULTS="$OUT/torch.jsonl" timeout 240 ./run.sh \
  >"$OUT/bench.jsonl" 2>"$OUT/bench.err")
echo "bench rc=$?"
grep -E '"what":"(muonps_ns_all|muonps_update_1gpu)"' "$OUT/bench.jsonl"
echo "== autotune"
timeout 100 "$B/bin/muonps-autotune" --backend cuda --precision bf16 \
  --out "$OUT/cost_table.jsonl" >"$OUT/autotune.jsonl" 2>>"$OUT/bench.err"
echo "autotune rc=$?"
if [[ "${NCU:-0}" == 1 ]]; then
  echo "== ncu"
  ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  # One eager (graph-free) NS run of the Llama set: a stretch of its
  # GEMMs and combine kernels in steady state.
  timeout 200 "$ncu_bin" --clock-control none --launch-skip 60 --launch-count 16 \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    "$B/bin/ns_gpu_timing" --micro=false --repeats=1 \
    --only=bf16_tiles16_nographs >"$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"
fi
