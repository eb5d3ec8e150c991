#!/usr/bin/env bash
# Bundles everything the GPU verification of the CUDA backend needs into
# device_bundle/: the GPU tests, golden_replay (with the golden data), the
# NS timing micro-benchmarks, bench/ns_gpu (with its torch peer script) and
# the autotuner, plus run_gpu_suite.sh.
# On the GPU machine: bash device_bundle/run_gpu_suite.sh   (NCU=1 adds ncu)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE_DIR=device_bundle deploy/device/bundle.sh \
  //kernels/cuda:cuda_kernels_ns_gpu_test //kernels/cuda:cuda_kernels_step_gpu_test \
  //kernels/cuda:cuda_kernels_streams_gpu_test \
  //kernels/cuda:ns_plans_gpu_test //kernels/cuda:ns_accuracy_gpu_test \
  //kernels/cuda:elementwise_gpu_test //kernels/cuda:cuda_kernels_test \
  //tools/golden_replay:replay_backend_test //tools/golden_replay:golden_replay \
  //kernels/cuda:ns_gpu_timing //bench/ns_gpu:ns_gpu_bench \
  //lending:cuda_ipc_memory_gpu_test //lending:cuda_ipc_event_gpu_test \
  //tools/autotune:muonps-autotune //transport:nccl_transport_gpu_test \
  //transport:cuda_ipc_transport_gpu_test
cp -r testdata/torch_optim_golden device_bundle/golden
cp bench/ns_gpu/run.sh bench/ns_gpu/torch_peers.py bench/ns_gpu/torch_step_peers.py deploy/device/run_gpu_suite.sh \
  device_bundle/
du -sh device_bundle
