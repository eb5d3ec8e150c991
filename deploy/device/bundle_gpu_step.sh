#!/usr/bin/env bash
# Bundles the GPU data path for the GPU machine into device_bundle/: the
# coordinator and worker, the GPU tests of the data path (CUDA IPC, NCCL
# transport, the worker on a GPU, two workers on two GPUs: that one skips
# on a machine of one GPU), libmuonps.so for the Python package's
# GPU tests (client/python travels with the working tree), bench/step_gpu
# with its torch peers, and muonps-autotune (the cost table a worker reads).
# On the GPU machine: bash device_bundle/run_gpu_step_suite.sh (one GPU) or
# bash device_bundle/run_multi_gpu_suite.sh (several GPUs)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE_DIR=device_bundle deploy/device/bundle.sh \
  //server/coordinator:muonps-coordinator //server/worker:muonps-worker \
  //lending:cuda_ipc_memory_gpu_test //lending:cuda_ipc_event_gpu_test \
  //transport:nccl_transport_gpu_test //transport:cuda_ipc_transport_gpu_test \
  //kernels/cuda:elementwise_gpu_test \
  //kernels/cuda:cuda_kernels_ns_gpu_test //kernels/cuda:cuda_kernels_step_gpu_test \
  //kernels/cuda:cuda_kernels_streams_gpu_test \
  //tests:gpu_step_test //tests:gpu_two_workers_test //tests:gpu_two_gpus_test \
  //bench/step_gpu:step_gpu_bench //client:libmuonps.so \
  //tools/autotune:muonps-autotune
cp bench/step_gpu/run.sh device_bundle/run_step_gpu.sh
cp bench/step_gpu/apply_early_ab.sh device_bundle/
# The tests' TLS credentials (tests/harness finds them beside the binaries).
bazel build //tests/testdata:tls
cp bazel-bin/tests/testdata/tls/* device_bundle/bin/
chmod u+w device_bundle/bin/*
cp bench/ns_gpu/torch_peers.py bench/ns_gpu/torch_step_peers.py deploy/device/run_gpu_step_suite.sh \
  deploy/device/run_multi_gpu_suite.sh device_bundle/
# examples/train_gpt.py's corpus (the GPU machine has no python3-doc).
"${PYTHON:-/usr/bin/python3}" examples/train_gpt.py --prepare device_bundle/corpus.bin
du -sh device_bundle
# The device tool carries at most 64 MiB: ship the bundle compressed
# (about 13 MiB); on the GPU machine: tar -xJf device_bundle.tar.xz
tar -cJf device_bundle.tar.xz device_bundle
ls -la device_bundle.tar.xz
