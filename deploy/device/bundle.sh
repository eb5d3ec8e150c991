#!/usr/bin/env bash
# Builds Bazel targets and gathers them, with every shared library they need
# that the GPU machine lacks, into device_bundle/ (git-ignored), which the
# device tool carries to the GPU machine. The GPU machine supplies libc,
# libstdc++, the CUDA driver, cudart, cuBLAS and NCCL itself (see
# ../shared/DEVICE.md); everything else from `ldd` travels.
#
# Usage: [BUNDLE_DIR=dir] deploy/device/bundle.sh TARGET...
#   (e.g. //kernels/cuda:elementwise_gpu_test; BUNDLE_DIR defaults to device_bundle)
set -euo pipefail
cd "$(dirname "$0")/../.."
(($#)) || { echo "usage: $0 TARGET..." >&2; exit 2; }

bundle="${BUNDLE_DIR:-device_bundle}"
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
bazel build "$@"

# Libraries the GPU machine provides (or that must come from its own CUDA).
provided='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libgcc_s|libstdc\+\+|libcuda\.|libcudart|libcublas|libnccl)'
for target in "$@"; do
  # //pkg/path:name is built at bazel-bin/pkg/path/name.
  pkg="${target#//}"
  file="bazel-bin/${pkg%%:*}/${pkg##*:}"
  for file in "$file"; do
    [[ -f "$file" ]] || { echo "no binary at $file" >&2; exit 1; }
    cp "$file" "$bundle/bin/"
    ldd "$file" | awk '/=>/ {print $1, $3}' | while read -r name path; do
      [[ "$name" =~ $provided ]] && continue
      [[ -f "$path" ]] && cp -Ln "$path" "$bundle/lib/$name"
    done
  done
done
cp deploy/device/run_gpu_tests.sh "$bundle/"
du -sh "$bundle"
