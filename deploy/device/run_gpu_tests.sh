#!/usr/bin/env bash
# Runs every bundled test binary on the GPU machine with the bundled
# libraries plus the machine's own CUDA and NCCL. Prints each binary's
# GoogleTest output and ends with "N passed, M failed".
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
passed=0
failed=0
for test in "$here"/bin/*_test; do
  [[ -x "$test" ]] || continue
  echo "== $(basename "$test")"
  out="$("$test" 2>&1)"
  echo "$out"
  p=$(echo "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
  f=$(echo "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
  if [[ -z "$p" && -z "$f" ]]; then f=1; fi
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
done
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
