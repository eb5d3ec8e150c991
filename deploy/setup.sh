#!/usr/bin/env bash
# Installs everything muonps needs to build and test on Debian 12, from
# Debian's packages only. Idempotent: packages already present are skipped,
# so a second run costs a second. The CUDA toolkit is expected at
# /usr/local/cuda (it ships with the machine image); no GPU is needed to build.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3
  golang-google-grpc-dev   # reflection.proto and health.proto sources
  build-essential
  clang-format
  clang libclang-rt-14-dev  # fuzz/: clang 14 with libFuzzer, ASan, UBSan
  googletest libgtest-dev libgmock-dev
  libabsl-dev
  libcpp-httplib-dev       # Prometheus /metrics endpoints
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libopenblas-dev
  libspdlog-dev
  libsqlite3-dev           # the coordinator's durable state (--state_dir)
  libssl-dev               # libcrypto: the data plane's HMAC-SHA256 membership proof
  nlohmann-json3-dev
  pkg-config
  python3
  python3-torch python3-numpy python3-matplotlib python3-pytest python3-setuptools  # Python package
  python3-pip python3-venv python3-wheel patchelf  # its wheel (client/python/build_wheel.sh)
  python3-doc  # examples/train_gpt.py's corpus
  iproute2 iptables  # failure tests: network namespaces that cut links (tests/harness)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  [[ "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$pkg")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: warning: no CUDA toolkit at /usr/local/cuda; GPU targets will not build" >&2
fi
echo "setup: all packages present"
