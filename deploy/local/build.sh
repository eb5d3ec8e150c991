#!/usr/bin/env bash
# Builds Bazel targets with a progress line every 20 s, so a cold first
# build (about 10 minutes on 2 cores) never looks stuck. The full output
# goes to $BUILD_LOG (default: a temporary file); on failure its last 30
# lines are printed.
#
#   deploy/local/build.sh //tools/golden_replay //tools/muonps
set -uo pipefail
cd "$(dirname "$0")/../.."
log="${BUILD_LOG:-$(mktemp /tmp/muonps-build.XXXXXX.log)}"
start=$SECONDS
bazel build --curses=no --color=no --show_progress_rate_limit=20 "$@" 2>&1 |
  tee "$log" |
  grep --line-buffered -E '^\[[0-9,]+ / [0-9,]+\]' |
  sed -u 's/^/   /'
rc=${PIPESTATUS[0]}
if [[ $rc -ne 0 ]]; then
  tail -n 30 "$log"
  echo "build failed (exit $rc); full output in $log" >&2
  exit "$rc"
fi
echo "   built in $((SECONDS - start)) s"
