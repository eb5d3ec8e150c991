#!/usr/bin/env bash
# bench/train_step on a GPU machine, from the repository root there, with the
# muonps binaries of deploy/device/bundle_gpu_step.sh's bundle
# (device_bundle.tar.xz at the root, unpacked here when device_bundle/ is
# missing). Starts the CUDA MPS daemon first (MPS=0 skips it), since with
# muonps the trainer and its worker are two processes on each GPU, and stops
# it at the end if it started it. Every argument goes to train_step.py; JSON
# lines on stdout.
#   GPUS (1): more runs train_step.py under torchrun, one rank a GPU (pass
#     --parallel ddp or fsdp).
#   COMPARE_NO_MPS (0): 1 runs adamw and muonps again after stopping MPS
#     (the trainer and its worker then time-slice the GPU).
#   MPS_FALLBACK (1): if a muonps line reports an error under MPS, runs
#     adamw and muonps again without it.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
if [[ ! -x device_bundle/bin/muonps-worker ]]; then
  tar -xJf device_bundle.tar.xz || { echo "run_gpu.sh: no device bundle" >&2; exit 2; }
fi
bundle="$root/device_bundle"
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUONPS_BIN_DIR="$bundle/bin" MUONPS_LIB="$bundle/bin/libmuonps.so"
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
gpus="${GPUS:-1}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >&2 || true

mps_started=0
start_mps() {
  local control
  control="$(command -v nvidia-cuda-mps-control || true)"
  if [[ -z "$control" ]]; then
    echo "run_gpu.sh: no nvidia-cuda-mps-control; running without MPS" >&2
    return 1
  fi
  if echo get_server_list | "$control" >/dev/null 2>&1; then
    echo "run_gpu.sh: an MPS daemon is running already" >&2
    export TRAIN_STEP_CUDA_MPS=1
    return 0
  fi
  "$control" -d || { echo "run_gpu.sh: MPS did not start" >&2; return 1; }
  mps_started=1
  export TRAIN_STEP_CUDA_MPS=1
  # A CUDA client must get a context through it; otherwise go without.
  if ! timeout 60 python3 -c 'import torch; torch.ones(1, device="cuda").sum().item()'; then
    echo "run_gpu.sh: a CUDA client failed under MPS; running without MPS" >&2
    stop_mps
    return 1
  fi
  echo "run_gpu.sh: MPS daemon started" >&2
}
stop_mps() {
  if ((mps_started)); then
    echo quit | nvidia-cuda-mps-control || true
    sleep 1
    mps_started=0
  fi
  export TRAIN_STEP_CUDA_MPS=0
}
trap stop_mps EXIT

bench() {
  if ((gpus > 1)); then
    torchrun --standalone --nproc_per_node "$gpus" bench/train_step/train_step.py "$@"
  else
    python3 bench/train_step/train_step.py "$@"
  fi
}

export TRAIN_STEP_CUDA_MPS=0
[[ "${MPS:-1}" == 1 ]] && start_mps
log="$(mktemp /tmp/train-step-XXXXXX.jsonl)"
bench "$@" | tee "$log"
status=${PIPESTATUS[0]}
failed_muonps=0
grep '"optimizer": "muonps"' "$log" | grep -q '"error"' && failed_muonps=1
if [[ "$TRAIN_STEP_CUDA_MPS" == 1 ]] && { [[ "${COMPARE_NO_MPS:-0}" == 1 ]] ||
    { ((failed_muonps)) && [[ "${MPS_FALLBACK:-1}" == 1 ]]; }; }; then
  echo "run_gpu.sh: adamw and muonps again without MPS" >&2
  stop_mps
  bench "$@" --optimizers adamw,muonps
  status=$?
fi
exit "$status"
