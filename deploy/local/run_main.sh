#!/usr/bin/env bash
# The main job, for now: installs what is needed, builds muonps, replays
# PyTorch's golden optimizer trajectories (../shared/testdata) through the
# CPU kernels with both Newton-Schulz algorithms, then starts a coordinator
# and two workers on loopback and shows the ownership plan they agree on.
# Exits non-zero on any miss.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/setup.sh
GOLDEN="${GOLDEN:-$(cd .. && pwd)/shared/testdata/torch_optim_golden}"
bazel build //tools/golden_replay
for algorithm in ns5 gram; do
  echo "== golden replay, --algorithm $algorithm"
  bazel-bin/tools/golden_replay/golden_replay --golden "$GOLDEN" \
    --algorithm "$algorithm" --backend cpu
done
bash deploy/local/control_plane_demo.sh
