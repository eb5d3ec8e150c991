#!/usr/bin/env bash
# Runs the built images on this machine: the coordinator and a CPU worker
# from the images' own root filesystems, and the example trainer outside them
# trains a few steps through them.
#
#   tests/deploy/image_run_test.sh [--images DIR] [--steps N]
#
# DIR holds the OCI layouts of deploy/container/build.sh (default
# deploy/container/out). `podman run` cannot start containers on these
# machines (setrlimit RLIMIT_NOFILE: Operation not permitted, crun and runc
# alike), so each image is unpacked with umoci (rootfs + its OCI config) and
# its entrypoint started under `unshare --mount --pid --fork` + chroot as the
# image's user, as a runtime would: own mount and PID namespaces, the host's
# loopback network, /dev/shm and the socket folder shared with the trainer the
# way a pod's containers share them. The trainer runs as the image's UID, as a
# sidecar's trainer must (shared-memory files are mode 0600).
# Ends with "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
images="$root/deploy/container/out"
steps=5
while (($#)); do
  case "$1" in
    --images) images="$(realpath "$2")"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "image_run_test.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "image_run_test.sh: run as root (unshare, chroot)" >&2; exit 1; }
for role in muonps-coordinator muonps-worker; do
  [[ -f "$images/$role/index.json" ]] || {
    echo "image_run_test.sh: no image at $images/$role; run deploy/container/build.sh first" >&2; exit 1; }
done
trainer="$root/bazel-bin/examples/trainer/mlp_trainer"
[[ -x "$trainer" ]] || { echo "image_run_test.sh: build //examples/trainer:mlp_trainer first" >&2; exit 1; }

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

work="$(mktemp -d /tmp/muonps-image-run-XXXXXX)"
pids=()
cleanup() {
  # unshare --fork ignores SIGTERM while it waits. Its child (the image's
  # process, PID 1 of its namespace) goes first: --kill-child's death signal
  # does not survive chroot --userspec changing the user, so killing unshare
  # alone would leave the service running.
  stop_images
  rm -rf "$work"
}
stop_images() {
  for pid in "${pids[@]}"; do
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# Unpacks the image and prints "UID:GID ENTRYPOINT..." from its OCI config.
unpack() {  # unpack ROLE
  local role="$1" tag
  tag="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])' "$images/$role/index.json")"
  umoci unpack --image "$images/$role:$tag" "$work/$role" >/dev/null
}
unpack muonps-coordinator
unpack muonps-worker
process() {  # process ROLE -> "uid gid arg0 args..." one per line
  python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["process"]
print(p["user"]["uid"]); print(p["user"]["gid"])
for a in p["args"]: print(a)' "$work/$1/config.json"
}

shared="$work/shared"       # the pod's socket emptyDir
mkdir -p "$shared"
# TLS and the bearer token, mounted as a pod's Secret volume would be.
bash "$root/deploy/local/make_credentials.sh" "$shared/credentials"
chown -R 65532:65532 "$shared"
creds=/var/run/muonps/credentials  # where the images see them

# run_image ROLE LOG ARGS...: the image's entrypoint with ARGS appended.
run_image() {
  local role="$1" log="$2"
  shift 2
  local spec
  mapfile -t spec < <(process "$role")
  local rootfs="$work/$role/rootfs"
  mkdir -p "$rootfs/var/run/muonps" "$rootfs/dev" "$rootfs/proc"
  unshare --mount --pid --fork --kill-child bash -c '
    set -e
    rootfs="$1"; shared="$2"; shift 2
    mount --rbind /dev "$rootfs/dev"
    mount --bind /dev/shm "$rootfs/dev/shm"
    mount -t proc proc "$rootfs/proc"
    mount --bind "$shared" "$rootfs/var/run/muonps"
    exec chroot --userspec="$1:$2" "$rootfs" "${@:3}"
  ' run "$rootfs" "$shared" "${spec[@]}" "$@" >"$log" 2>&1 &
  pids+=($!)
}

wait_for() {  # wait_for FILE REGEX SECONDS -> prints capture
  local file="$1" regex="$2" deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    local hit
    hit="$(sed -n "s/.*${regex}.*/\1/p" "$file" 2>/dev/null | head -n 1)"
    [[ -n "$hit" ]] && { echo "$hit"; return 0; }
    sleep 0.1
  done
  echo "timed out waiting for /$regex/ in $file:" >&2
  tail -5 "$file" >&2 || true
  return 1
}

echo "== coordinator from the muonps-coordinator image"
run_image muonps-coordinator "$work/coordinator.log" --host 127.0.0.1 --port 0 --metrics_port 0 \
  --tls_cert_file "$creds/server.pem" --tls_key_file "$creds/server.key" --token_file "$creds/token"
if coordinator="$(wait_for "$work/coordinator.log" 'listening on \([0-9.:]*\)' 20)"; then
  pass "coordinator from the image listens on $coordinator (as uid $(process muonps-coordinator | head -n 1))"
else
  fail "coordinator from the image starts"
  echo "${passed} passed, ${failed} failed"; exit 1
fi
metrics="$(wait_for "$work/coordinator.log" 'metrics on \(http[^ ]*\)' 5 || true)"

# What the chart's workers.costTable.autotune initContainer runs (there on
# the GPU, --backend=cuda), into the folder the worker then reads.
echo "== muonps-autotune from the muonps-worker image writes a cost table"
costs=/var/lib/muonps-costs
worker_rootfs="$work/muonps-worker/rootfs"
mkdir -p "$worker_rootfs/proc" "$worker_rootfs$costs"
chown 65532:65532 "$worker_rootfs$costs"
if unshare --mount --pid --fork --kill-child bash -c '
    set -e
    mount -t proc proc "$1/proc"
    exec chroot --userspec=65532:65532 "$1" /usr/local/bin/muonps-autotune --backend=cpu \
      --shapes=64x128,96x96 --batches=1,2 --repeats=1 --warmup=0 --sustain_seconds=0 \
      --threads=1 --out="$2/cost_table.jsonl"
  ' run "$worker_rootfs" "$costs" >"$work/autotune.log" 2>&1 &&
   [[ "$(grep -c '"seconds"' "$worker_rootfs$costs/cost_table.jsonl")" -eq 8 ]]; then
  pass "the image's muonps-autotune measured 2 shapes x 2 batches x 2 algorithms into $costs"
  cost_args=(--cost_table "$costs/cost_table.jsonl")
else
  tail -5 "$work/autotune.log"
  fail "the image's muonps-autotune writes a cost table"
  cost_args=()
fi

echo "== CPU worker from the muonps-worker image"
job="image-test-$$"
run_image muonps-worker "$work/worker.log" --coordinator "$coordinator" --job "$job" \
  --worker_id w0 --socket /var/run/muonps/worker.sock --device cpu --metrics_port 0 \
  --token_file "$creds/token" --tls_ca_file "$creds/ca.pem" \
  --memory_bytes $((1 << 30)) ${cost_args[@]+"${cost_args[@]}"}
if wait_for "$work/worker.log" 'listening on unix:\(.*\)' 20 >/dev/null; then
  pass "worker from the image joined job $job (CUDA libraries load, CPU device${cost_args[*]:+, with the cost table})"
else
  fail "worker from the image starts"
  echo "${passed} passed, ${failed} failed"; exit 1
fi

echo "== the example trainer (outside the images) trains $steps steps"
cp "$trainer" "$work/mlp_trainer"
chmod 0755 "$work" "$work/mlp_trainer"
if MUONPS_TOKEN_FILE="$shared/credentials/token" MUONPS_TLS_CA_FILE="$shared/credentials/ca.pem" \
    setpriv --reuid=65532 --regid=65532 --clear-groups "$work/mlp_trainer" \
    --coordinator "$coordinator" --job "$job" --worker_socket "$shared/worker.sock" \
    --rank 0 --ranks 1 --steps "$steps" >"$work/trainer.log" 2>&1; then
  summary="$(grep '^{"initial_loss"' "$work/trainer.log" | tail -n 1)"
  if python3 -c '
import json, sys
d = json.loads(sys.argv[1]); steps = int(sys.argv[2])
assert d["steps"] == steps and d["final_loss"] < d["initial_loss"], d' "$summary" "$steps"; then
    pass "trainer trained $steps steps through the images: $summary"
  else
    fail "trainer's loss did not fall: $summary"
  fi
else
  tail -5 "$work/trainer.log"
  fail "trainer through the images"
fi
if [[ -n "$metrics" ]] && python3 -c '
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
assert "muonps_" in text' "$metrics"; then
  pass "coordinator /metrics from the image serves muonps_ metrics"
else
  fail "coordinator /metrics from the image"
fi
# What the chart's `helm test` runs: the image's CLI asks grpc.health.v1.
cp "$shared/credentials/ca.pem" "$work/muonps-coordinator/rootfs/ca.pem"
if health="$(chroot --userspec=65532:65532 "$work/muonps-coordinator/rootfs" \
    /usr/local/bin/muonps health --coordinator "$coordinator" \
    --tls_ca_file /ca.pem 2>&1)" &&
    [[ "$health" == SERVING ]]; then
  pass "the image's muonps health (helm test) reports the coordinator SERVING"
else
  fail "the image's muonps health: $health"
fi
# Nothing the images started outlives the test.
children=()
for pid in "${pids[@]}"; do
  mapfile -t -O "${#children[@]}" children < <(pgrep -P "$pid")
done
stop_images
left=("${children[@]}")
for ((i = 0; i < 50 && ${#left[@]} > 0; i++)); do  # reaped within 5 s
  sleep 0.1
  still=()
  for pid in "${left[@]}"; do kill -0 "$pid" 2>/dev/null && still+=("$pid"); done
  left=(${still[@]+"${still[@]}"})
done
if [[ ${#children[@]} -gt 0 && ${#left[@]} -eq 0 ]]; then
  pass "the images' ${#children[@]} processes are stopped with the test"
else
  fail "processes of the images still run after the test: ${left[*]:-none found}"
fi
echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
