#!/usr/bin/env bash
# Runs bench/ns_gpu on the GPU machine in one go: the PyTorch peers
# (torch_peers.py), then ns_gpu_bench with their figures, so every ratio is
# against peers measured in the same run on the same GPU. Prints every JSON
# line on stdout (torch's first, then muonps's); progress and errors go to
# stderr. Extra arguments go to ns_gpu_bench.
#
# Run from a device bundle (deploy/device/bundle.sh //bench/ns_gpu:ns_gpu_bench,
# with this script, torch_peers.py and torch_step_peers.py beside bin/ and
# lib/), or set
# NS_GPU_BENCH to the binary. TORCH_RESULTS names the peers' file (default: a
# temporary file).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="${NS_GPU_BENCH:-$here/bin/ns_gpu_bench}"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
torch_results="${TORCH_RESULTS:-$(mktemp --suffix=.jsonl)}"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.limit \
  --format=csv,noheader >&2 || true
python3 "$here/torch_peers.py" --out "$torch_results"
"$bench" --torch_results "$torch_results" "$@"
