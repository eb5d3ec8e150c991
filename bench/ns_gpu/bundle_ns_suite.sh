#!/usr/bin/env bash
# Bundles the Newton-Schulz GPU run (run_ns_suite.sh) into device_bundle_ns/ and
# device_bundle_ns.tar.xz (both git-ignored): the CUDA NS tests, golden
# replay with the golden data, ns_gpu_timing, ns_gpu_bench with its torch
# peers. On the GPU machine: tar xJf device_bundle_ns.tar.xz &&
# bash device_bundle_ns/run_ns_suite.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE_DIR=device_bundle_ns deploy/device/bundle.sh \
  //kernels/cuda:ns_plans_gpu_test //kernels/cuda:ns_accuracy_gpu_test \
  //kernels/cuda:cuda_kernels_ns_gpu_test //kernels/cuda:cuda_kernels_step_gpu_test \
  //kernels/cuda:cuda_kernels_streams_gpu_test \
  //kernels/cuda:cuda_kernels_test //kernels/cuda:elementwise_gpu_test \
  //kernels/cuda:lt_gemm_gpu_test \
  //tools/golden_replay:golden_replay //kernels/cuda:ns_gpu_timing \
  //bench/ns_gpu:ns_gpu_bench
cp -r testdata/torch_optim_golden device_bundle_ns/golden
cp bench/ns_gpu/torch_peers.py bench/ns_gpu/torch_step_peers.py bench/ns_gpu/run_ns_suite.sh device_bundle_ns/
strip device_bundle_ns/bin/* 2>/dev/null || true
tar cJf device_bundle_ns.tar.xz device_bundle_ns
du -sh device_bundle_ns device_bundle_ns.tar.xz
