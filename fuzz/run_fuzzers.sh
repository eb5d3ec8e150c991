#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (--config=sanitize: ASan + UBSan +
# libFuzzer, in the output base tests/run_all.sh's sanitizer tests use, so
# the two share every library and the gcc build's outputs stay valid) and
# runs each for SECONDS on a copy of its committed corpus (the checkout is never
# written). Prints per target the executions, coverage (cov: edges, ft:
# features, from libFuzzer's final stats) and whether it crashed; crashing
# inputs are kept under $FUZZ_ARTIFACTS (default: a fresh temporary folder).
# Ends with "N passed, M failed" (one per target); exits non-zero on any
# crash or build failure.
#
#   fuzz/run_fuzzers.sh 30                    # every target, 30 s each
#   fuzz/run_fuzzers.sh 300 c_abi_fuzzer      # one target, 5 minutes
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:?usage: run_fuzzers.sh SECONDS [TARGET...]}"
shift
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(coordinator_rpc_fuzzer worker_rpc_fuzzer wire_format_fuzzer
    plan_decoder_fuzzer c_abi_fuzzer checkpoint_manifest_fuzzer)
fi

# The longest input each target reads: a handful of requests, a handshake
# and some frame headers, a few C calls.
max_len() {
  case "$1" in
    wire_format_fuzzer) echo 512 ;;
    c_abi_fuzzer) echo 4096 ;;
    *) echo 16384 ;;
  esac
}

bazel_fuzz=(bazel "--output_base=${MUONPS_SANITIZE_OUTPUT_BASE:-$HOME/.cache/muonps-sanitize}")
labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done

echo "== building ${#targets[@]} fuzz targets with clang (--config=sanitize)"
start=$(date +%s)
build_log="$(mktemp /tmp/muonps-fuzz-build.XXXXXX)"
# --symlink_prefix=/: no bazel-bin/bazel-out links in the checkout, which
# would otherwise point at this output base and hide the gcc build's
# binaries from whatever runs next (CI's image build).
if ! "${bazel_fuzz[@]}" build --config=sanitize --symlink_prefix=/ "${labels[@]}" \
    >"$build_log" 2>&1; then
  grep -v "Cannot export local symbol" "$build_log" | tail -n 40
  rm -f "$build_log"
  echo "fuzz targets: build failed"
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi
rm -f "$build_log"
echo "build took $(($(date +%s) - start)) s"
bin="$("${bazel_fuzz[@]}" info --config=sanitize bazel-bin 2>/dev/null)/fuzz"

artifacts="${FUZZ_ARTIFACTS:-$(mktemp -d /tmp/muonps-fuzz-artifacts.XXXXXX)}"
mkdir -p "$artifacts"
work="$(mktemp -d /tmp/muonps-fuzz-run.XXXXXX)"
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
for t in "${targets[@]}"; do
  corpus="$work/$t"
  mkdir -p "$corpus"
  cp fuzz/corpus/"$t"/* "$corpus"/
  log="$work/$t.log"
  # -timeout: one input running 10 s is a hang; leaks count as crashes.
  # -entropic=0: libFuzzer's entropic scheduling spent most of the time
  # updating feature frequencies here (4x fewer executions in 10 s, the same
  # coverage). FUZZ_FLAGS adds more (e.g. -jobs, -dict).
  # shellcheck disable=SC2086
  "$bin/$t" -max_total_time="$seconds" -max_len="$(max_len "$t")" \
    -timeout=10 -rss_limit_mb=4096 -entropic=0 -print_final_stats=1 \
    ${FUZZ_FLAGS:-} \
    -artifact_prefix="$artifacts/$t-" "$corpus" >"$log" 2>&1
  rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  last="$(grep -E '^#[0-9]+' "$log" | tail -n 1)"
  cov="$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')"
  ft="$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')"
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    verdict="ok"
  else
    failed=$((failed + 1))
    verdict="CRASHED (exit $rc; inputs under $artifacts)"
    grep -E 'ERROR: |SUMMARY: |runtime error|Test unit written' "$log" | head -n 10
  fi
  echo "$t: ${seconds} s, execs=${execs:-?} cov=${cov:-?} ft=${ft:-?} corpus=$(ls "$corpus" | wc -l): $verdict"
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
