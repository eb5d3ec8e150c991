#!/usr/bin/env bash
# On the GPU machine, from the bundle of deploy/device/bundle_gpu_step.sh:
# every GPU test of the data path ("N passed, M failed"), then
# bench/step_gpu (JSON lines). BENCH=0 skips the benchmark.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export MUONPS_BIN_DIR="$here/bin"
bash "$here/run_gpu_tests.sh"
tests=$?
# muonps.Muon on CUDA tensors against torch.optim.Muon (the working tree's
# client/python, the bundle's libmuonps.so and binaries).
repo="$(cd "$here/.." && pwd)"
if [[ -d "$repo/client/python/tests" ]]; then
  nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
  echo "== python: client/python/tests/test_cuda.py, GPU cases of test_ddp.py"
  LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}" \
    MUONPS_LIB="$here/bin/libmuonps.so" \
    python3 -m pytest -q -s -p no:cacheprovider "$repo/client/python/tests/test_cuda.py" \
    "$repo/client/python/tests/test_ddp.py" -k "cuda or gpu" \
    || tests=1
  # torchrun and `python -m muonps.run` (Debian's torch 1.13 cannot run
  # torchrun, so CI skips them), and zero setup on this machine's torch.
  echo "== python: torchrun, muonps.run, zero setup (torch $(python3 -c 'import torch; print(torch.__version__)'))"
  LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}" \
    MUONPS_LIB="$here/bin/libmuonps.so" \
    python3 -m pytest -q -p no:cacheprovider "$repo/client/python/tests/test_torchrun.py" \
    "$repo/client/python/tests/test_zero_setup.py" "$repo/client/python/tests/test_fsdp.py" || tests=1
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  bash "$here/run_step_gpu.sh" || tests=1
fi
exit $tests
