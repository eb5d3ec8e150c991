#!/usr/bin/env bash
# The main job: installs what is needed, builds muonps, replays PyTorch's
# golden optimizer trajectories through the CPU kernels, then starts a local
# cluster (a coordinator, 2 workers and 2 trainer ranks on this machine) that
# trains the example MLP through muonps. The last line is one JSON object:
# initial_loss, final_loss, steps, layout, parity_max_rel_err (the final
# parameters against a single-process run of the same kernels).
# Flags go to deploy/local/launch.sh (e.g. --layout row_sharded --steps 50).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/setup.sh
GOLDEN="${GOLDEN:-testdata/torch_optim_golden}"
echo "== building (a first build takes about 10 minutes on 2 cores)"
bash deploy/local/build.sh //tools/golden_replay \
  //server/coordinator:muonps-coordinator //server/worker:muonps-worker \
  //examples/trainer:mlp_trainer //tools/muonps
echo "== golden replay (PyTorch's trajectories through the CPU kernels)"
"$(bazel info bazel-bin 2>/dev/null)/tools/golden_replay/golden_replay" \
  --golden "$GOLDEN" --algorithm gram | tail -n 1
echo "== local cluster: coordinator + 2 workers + 2 trainer ranks"
bash deploy/local/launch.sh --workers 2 --trainers 2 --steps 50 "$@"
