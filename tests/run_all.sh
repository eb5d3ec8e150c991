#!/usr/bin/env bash
# Runs every check CI runs: formatting, all unit and integration tests, the
# tests again under clang with AddressSanitizer + UndefinedBehaviorSanitizer
# (one configuration, whose libraries the libFuzzer targets share), a build
# of the GPU-only targets, the golden replays, the Python package's tests,
# every libFuzzer target for 30 s (fuzz/run_fuzzers.sh), the Helm chart, the
# local cluster through a coordinator kill and the container images. Installs what it needs first; prints each stage's
# time. About 45 minutes on a cold 2-core machine, a few once Bazel's caches
# are warm. Ends with "N passed, M failed" (GoogleTest cases, plus one
# failure for each test target that failed outside its cases, as a leak
# found at exit; plus golden cases plus fuzz targets plus the other checks)
# and exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh || exit 1

passed=0
failed=0
count() {  # count PASSED FAILED
  passed=$((passed + $1))
  failed=$((failed + $2))
}
# count_summary OUTPUT: counts a check's last line, "N passed, M failed"
# (a check that printed none counts as one failure).
count_summary() {
  if [[ "$(echo "$1" | tail -n 1)" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    count "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
  else
    count 0 1
  fi
}

# stage NAME: ends the previous stage (printing its time) and starts NAME.
stage_name=""
stage_start=$SECONDS
run_start=$SECONDS
stage() {
  if [[ -n "$stage_name" ]]; then
    echo "-- $stage_name: $((SECONDS - stage_start)) s"
  fi
  stage_name="$1"
  stage_start=$SECONDS
  [[ -n "$1" ]] && echo "== $1"
}

stage "clang-format"
mapfile -t sources < <(git ls-files '*.h' '*.cc' '*.cu')
if clang-format --dry-run --Werror "${sources[@]}"; then count 1 0; else count 0 1; fi

# Sums the GoogleTest totals of every test.xml under a testlogs folder
# ($1), and counts one failure more for each target Bazel failed (its
# "FAIL: //... (see .../test.log)" lines in the file $2) whose test.xml
# shows none: a target can fail after its cases passed (LeakSanitizer at
# exit, a crash in a destructor).
gtest_totals() {
  python3 - "$1" "$2" <<'PY'
import pathlib, re, sys, xml.etree.ElementTree as ET
def totals(xml):
    tests = bad = 0
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else root.iter("testsuites")
    for s in suites:
        tests += int(s.get("tests", 0)) - int(s.get("disabled", 0))
        bad += int(s.get("failures", 0)) + int(s.get("errors", 0))
    return tests, bad
tests = bad = 0
for xml in pathlib.Path(sys.argv[1]).rglob("test.xml"):
    t, b = totals(xml)
    tests += t
    bad += b
for line in pathlib.Path(sys.argv[2]).read_text(errors="replace").splitlines():
    m = re.match(r"FAIL: (//\S+) \(see (\S+)/test\.log\)", line)
    if not m:
        continue
    xml = pathlib.Path(m.group(2)) / "test.xml"
    if not xml.exists() or totals(xml)[1] == 0:
        print(f"{m.group(1)} failed outside its cases", file=sys.stderr)
        tests += 1
        bad += 1
print(tests - bad, bad)
PY
}

run_bazel_tests() {  # run_bazel_tests LABEL [bazel startup flags] -- [flags]
  local label="$1"
  shift
  local startup=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do startup+=("$1"); shift; done
  shift
  stage "bazel test $label"
  local logs
  logs="$(bazel ${startup[@]+"${startup[@]}"} info "$@" bazel-testlogs 2>/dev/null)"
  rm -rf "$logs"
  # gold's warnings about ASan's local symbols say nothing.
  local out
  out="$(mktemp)"
  bazel ${startup[@]+"${startup[@]}"} test "$@" --test_summary=short \
    "${packages[@]}" 2>&1 | grep -v "Cannot export local symbol" | tee "$out"
  local rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 && $rc -ne 3 ]]; then
    echo "bazel test $label: build failed (exit $rc)"
    count 0 1
    rm -f "$out"
    return
  fi
  # shellcheck disable=SC2046
  count $(gtest_totals "$logs" "$out")
  rm -f "$out"
}

# Every package, named from the BUILD files git tracks (//... would also walk
# into another output base's bazel-* links).
packages=(//:all)
mapfile -t -O 1 packages < <(git ls-files '*/BUILD' | cut -d/ -f1 | sort -u |
  sed 's|.*|//&/...|')

run_bazel_tests "(optimized)" -- 
# clang, in its own output base (shared with fuzz/run_fuzzers.sh).
sanitize_base="${MUONPS_SANITIZE_OUTPUT_BASE:-$HOME/.cache/muonps-sanitize}"
run_bazel_tests "(sanitize: clang, ASan + UBSan)" \
  "--output_base=$sanitize_base" -- --config=sanitize --symlink_prefix=/

stage "build of GPU-only targets (compile and link; they run on the GPU machine)"
if bazel build $(bazel query 'attr(tags, gpu, //...)' 2>/dev/null); then
  count 1 0
else
  count 0 1
fi

stage "golden replay"
GOLDEN=testdata/torch_optim_golden
for algorithm in ns5 gram; do
  out="$(bazel-bin/tools/golden_replay/golden_replay --golden "$GOLDEN" \
    --algorithm "$algorithm" 2>&1)"
  echo "$out"
  count_summary "$out"
done

if [[ -x client/python/run_tests.sh ]]; then
  stage "Python package (Debian's python3-torch)"
  bazel build //client:libmuonps.so //server/coordinator:muonps-coordinator \
    //server/worker:muonps-worker >/dev/null 2>&1
  # The package's tests, and bench/train_step's CPU smoke test (a few seconds).
  out="$(bash client/python/run_tests.sh bench/train_step/smoke_test.py 2>&1)"
  echo "$out" | tail -n 30
  summary="$(echo "$out" | grep -E '[0-9]+ (passed|failed)' | tail -n 1)"
  p="$(echo "$summary" | sed -n 's/.*\b\([0-9][0-9]*\) passed.*/\1/p')"
  f="$(echo "$summary" | sed -n 's/.*\b\([0-9][0-9]*\) failed.*/\1/p')"
  e="$(echo "$summary" | sed -n 's/.*\b\([0-9][0-9]*\) error.*/\1/p')"
  if [[ -z "$p$f$e" ]]; then count 0 1; else count "${p:-0}" $(( ${f:-0} + ${e:-0} )); fi
fi

stage "fuzz targets, 30 s each (clang + libFuzzer + ASan/UBSan, the sanitizer tests' output base)"
out="$(bash fuzz/run_fuzzers.sh 30 2>&1)"
echo "$out" | grep -vE '^(INFO|Loading|Analyzing)'
count_summary "$out"

stage "Helm chart (real helm lint/template, offline schema validation, bad values)"
out="$(bash tests/deploy/helm_checks.sh 2>&1)"
echo "$out" | grep -v '^PASS '
count_summary "$out"

stage "Local cluster (deploy/local/launch.sh through a coordinator kill -9, a rolling restart, 20 trainer kills)"
out="$(bash tests/deploy/launcher_recovery_check.sh 2>&1)"
echo "$out" | tail -n 8
count_summary "$out"

stage "Container images (build from Debian with mmdebstrap + umoci, run coordinator and CPU worker from them)"
out="$(bash tests/deploy/image_checks.sh 2>&1)"
echo "$out" | tail -n 12
count_summary "$out"

stage ""
echo "== all stages: $((SECONDS - run_start)) s"
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
