#!/usr/bin/env bash
# Runs the Python package's tests with Debian's python3-torch (/usr/bin/python3)
# against the binaries Bazel built (it builds nothing):
#   bazel build //client:libmuonps.so //server/coordinator:muonps-coordinator \
#     //server/worker:muonps-worker
#   bash client/python/run_tests.sh [PYTEST ARGS...]
# Prints pytest's summary line ("N passed, M failed in ...") last and exits
# with pytest's code. MUONPS_LIB overrides the library under test.
set -uo pipefail
cd "$(dirname "$0")/../.."
python=/usr/bin/python3
if ! "$python" -c 'import torch, numpy, pytest' 2>/dev/null; then
  echo "run_tests.sh: $python lacks torch, numpy or pytest: apt-get install -y" \
    "python3-torch python3-numpy python3-pytest" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
"$python" -m pytest -q -p no:cacheprovider client/python/tests "$@"
