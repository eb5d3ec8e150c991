#!/usr/bin/env bash
# Builds a platform wheel of muonps that carries the service: the Python
# package, libmuonps.so, the muonps-coordinator, muonps-worker and muonps
# binaries, and every shared library they link that a plain Debian/Ubuntu
# machine with PyTorch lacks (gRPC, protobuf, Abseil, OpenBLAS, ...; RPATHs
# set to $ORIGIN, so nothing else is needed at run time). CUDA's own
# libraries (cudart, cuBLAS, NCCL) are found where PyTorch's CUDA wheels put
# them (site-packages/nvidia/...) or in /usr/local/cuda/lib64.
#
#   bash client/python/build_wheel.sh [OUT_DIR]     # default: dist/
#   pip install dist/muonps-*.whl                   # no compiler, no Bazel
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
for tool in patchelf; do
  command -v "$tool" >/dev/null || { echo "build_wheel.sh: $tool is missing: bash deploy/setup.sh" >&2; exit 1; }
done
/usr/bin/python3 -c 'import wheel, setuptools' 2>/dev/null \
  || { echo "build_wheel.sh: python3-wheel is missing: bash deploy/setup.sh" >&2; exit 1; }

echo "== building the binaries"
bazel build //client:libmuonps.so //server/coordinator:muonps-coordinator \
  //server/worker:muonps-worker //tools/muonps >/dev/null
bin="$(bazel info bazel-bin 2>/dev/null)"

stage="$(mktemp -d /tmp/muonps-wheel-XXXXXX)"
trap 'rm -rf "$stage"' EXIT
cp -r client/python/muonps client/python/setup.py client/python/pyproject.toml \
  client/python/README.md "$stage/"
rm -rf "$stage/muonps/lib" "$stage/muonps/__pycache__"
mkdir -p "$stage/muonps/bin" "$stage/muonps/lib"
cp "$bin/server/coordinator/muonps-coordinator" "$bin/server/worker/muonps-worker" \
  "$bin/tools/muonps/muonps" "$stage/muonps/bin/"
cp "$bin/client/libmuonps.so" "$stage/muonps/lib/"
chmod u+w "$stage"/muonps/bin/* "$stage"/muonps/lib/*

# What the target machine has itself: the C runtime, and CUDA's libraries
# (a GPU machine's driver and toolkit, or PyTorch's nvidia-* wheels).
provided='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libgcc_s|libstdc\+\+|libcuda\.|libcudart|libcublas|libnccl)'
echo "== bundling shared libraries"
for file in "$stage"/muonps/bin/* "$stage/muonps/lib/libmuonps.so"; do
  ldd "$file" | awk '/=>/ {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $provided ]] && continue
    [[ -f "$path" ]] || { echo "build_wheel.sh: $file needs $name, which is not found" >&2; exit 1; }
    [[ -f "$stage/muonps/lib/$name" ]] || cp -L "$path" "$stage/muonps/lib/$name"
  done
done
chmod u+w "$stage"/muonps/lib/*
# CUDA libraries where PyTorch's CUDA 13 wheels install them (relative to
# site-packages/muonps/{bin,lib}), then the toolkit's.
nvidia='nvidia/cu13/lib:nvidia/cuda_runtime/lib:nvidia/cublas/lib:nvidia/nccl/lib'
cuda_paths() {  # cuda_paths ORIGIN_PREFIX
  local out="" d
  IFS=: read -ra dirs <<<"$nvidia"
  for d in "${dirs[@]}"; do out+=":$1/$d"; done
  echo "$out:/usr/local/cuda/lib64"
}
for file in "$stage"/muonps/bin/*; do
  patchelf --set-rpath "\$ORIGIN/../lib$(cuda_paths '$ORIGIN/../..')" "$file"
done
for file in "$stage"/muonps/lib/*; do
  patchelf --set-rpath "\$ORIGIN$(cuda_paths '$ORIGIN/../..')" "$file"
done

echo "== wheel"
rm -f "$out"/muonps-*.whl
(cd "$stage" && MUONPS_LIB="$stage/muonps/lib/libmuonps.so" \
  /usr/bin/python3 -m pip wheel --no-build-isolation --no-deps --no-index \
  -w "$out" . >/dev/null)
wheel="$(ls "$out"/muonps-*.whl)"
echo "$wheel ($(du -h "$wheel" | cut -f1), $(ls "$stage/muonps/lib" | wc -l) libraries)"
