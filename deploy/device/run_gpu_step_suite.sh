#!/usr/bin/env bash
# On the GPU machine, from the bundle of deploy/device/bundle_gpu_step.sh:
# every GPU test of the data path ("N passed, M failed"), then
# bench/step_gpu (JSON lines). BENCH=0 skips the benchmark.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export MUONPS_BIN_DIR="$here/bin"
bash "$here/run_gpu_tests.sh"
tests=$?
if [[ "${BENCH:-1}" == 1 ]]; then
  bash "$here/run_step_gpu.sh" || tests=1
fi
exit $tests
