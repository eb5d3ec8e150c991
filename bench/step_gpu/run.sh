#!/usr/bin/env bash
# bench/step_gpu on the GPU machine, in one run: the PyTorch peers first
# (fused AdamW, torch.optim.Muon, bf16 GEMM; torch_peers.py --skip_ns), then
# a muonps-coordinator and a muonps-worker --device cuda:0 and the
# step_gpu_bench trainer against them. JSON lines on stdout (torch's, then
# muonps's); logs and progress on stderr. Run from a bundle made by
# deploy/device/bundle_gpu_step.sh (bin/, lib/, this script, torch_peers.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nccl_lib="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
logs="$(mktemp -d /tmp/step-gpu-XXXXXX)"
torch_results="$logs/torch.jsonl"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
python3 "$here/torch_peers.py" --skip_ns --out "$torch_results" "${@}"
# A fresh bearer token, as a private service has (plaintext on loopback).
(umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' >"$logs/token")
export MUONPS_TOKEN_FILE="$logs/token"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$here/bin/muonps-coordinator" --port 0 --metrics_port -1 --insecure >"$logs/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$logs/coordinator.log" && break; sleep 0.1; done
coordinator="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$logs/coordinator.log" | head -1)"
"$here/bin/muonps-worker" --coordinator "$coordinator" --job step-gpu --worker_id w0 \
  --socket "$logs/w0.sock" --metrics_port -1 --device cuda:0 --io_timeout_ms 60000 \
  >"$logs/worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do grep -q "listening on unix" "$logs/worker.log" && break; sleep 0.1; done
"$here/bin/step_gpu_bench" --coordinator "$coordinator" --worker_socket "$logs/w0.sock" \
  --torch_results "$torch_results" | tee "$logs/one.jsonl" || { tail -20 "$logs/worker.log" >&2; exit 1; }
cleanup
pids=()
# Two trainers and two workers sharing the GPU (CUDA IPC peer transport).
"$here/bin/muonps-coordinator" --port 0 --metrics_port -1 --insecure >"$logs/coordinator2.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$logs/coordinator2.log" && break; sleep 0.1; done
coordinator="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$logs/coordinator2.log" | head -1)"
for w in 0 1; do
  "$here/bin/muonps-worker" --coordinator "$coordinator" --job step-gpu2 --worker_id "v$w" \
    --socket "$logs/v$w.sock" --metrics_port -1 --device cuda:0 --gpu_transport ipc \
    --io_timeout_ms 60000 >"$logs/worker-v$w.log" 2>&1 &
  pids+=($!)
done
for w in 0 1; do
  for _ in $(seq 300); do grep -q "listening on unix" "$logs/worker-v$w.log" && break; sleep 0.1; done
done
"$here/bin/step_gpu_bench" --coordinator "$coordinator" --job step-gpu2 \
  --worker_sockets "$logs/v0.sock,$logs/v1.sock" --torch_results "$torch_results" \
  --one_worker_results "$logs/one.jsonl" || { tail -20 "$logs/worker-v0.log" >&2; exit 1; }
