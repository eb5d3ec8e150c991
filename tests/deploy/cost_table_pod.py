"""Checks how a rendered worker pod gets its cost table (--cost_table).

  python3 cost_table_pod.py FILE.json KIND none
  python3 cost_table_pod.py FILE.json KIND configMap NAME KEY
  python3 cost_table_pod.py FILE.json KIND autotune AUTOTUNE_ARG...

FILE.json holds the rendered objects (manifests_json.mjs); the pod is the
template of the first object of KIND (StatefulSet: the pool; Job: the example
trainer with its sidecar), and the worker its container "muonps-worker".

  none       the worker has no --cost_table, the pod no autotune
             initContainer and no cost-table volume;
  configMap  the worker reads /etc/muonps/cost-table/cost_table.jsonl from a
             read-only mount of ConfigMap NAME's KEY, and nothing autotunes;
  autotune   an initContainer "muonps-autotune" runs the worker image's
             /usr/local/bin/muonps-autotune with exactly AUTOTUNE_ARG...,
             with the worker's resources (its GPU: nvidia.com/gpu or the
             claims) and security context and no NCCL_ variable, writing into
             an emptyDir that the worker mounts read-only and names in
             --cost_table.

Prints one line saying what it found; exits 1 with the first mismatch.
"""
import json
import sys

AUTOTUNE_DIR = "/var/lib/muonps-costs"
CONFIG_MAP_DIR = "/etc/muonps/cost-table"


def check(objects, kind, source, rest):
    obj = next((o for o in objects if o.get("kind") == kind), None)
    assert obj is not None, f"no {kind} rendered"
    pod = obj["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert "muonps-worker" in containers, f"{kind} has no muonps-worker container"
    worker = containers["muonps-worker"]
    flags = [a for a in worker.get("args", []) if a.startswith("--cost_table")]
    inits = [c for c in pod.get("initContainers", []) if c["name"] == "muonps-autotune"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in worker.get("volumeMounts", [])}

    if source == "none":
        assert not flags, f"worker has {flags}"
        assert not inits, "pod has a muonps-autotune initContainer"
        costly = [n for n in volumes if "cost" in n]
        assert not costly, f"pod has cost-table volumes {costly}"
        return f"{kind}: no --cost_table, no autotune"

    if source == "configMap":
        name, key = rest
        table = f"{CONFIG_MAP_DIR}/cost_table.jsonl"
        assert flags == [f"--cost_table={table}"], f"worker's flags {flags}"
        mount = mounts.get(CONFIG_MAP_DIR)
        assert mount and mount.get("readOnly"), f"worker mounts nothing read-only at {CONFIG_MAP_DIR}"
        volume = volumes[mount["name"]]
        assert volume.get("configMap", {}).get("name") == name, f"volume {volume}"
        assert volume["configMap"].get("items") == [{"key": key, "path": "cost_table.jsonl"}], \
            f"volume items {volume['configMap'].get('items')}"
        assert not inits, "pod has a muonps-autotune initContainer as well"
        return f"{kind}: --cost_table={table} from ConfigMap {name} key {key}, read-only"

    assert source == "autotune", f"unknown source {source}"
    table = f"{AUTOTUNE_DIR}/cost_table.jsonl"
    assert len(inits) == 1, f"{len(inits)} muonps-autotune initContainers"
    init = inits[0]
    assert init["image"] == worker["image"], f"image {init['image']} != {worker['image']}"
    assert init.get("command") == ["/usr/local/bin/muonps-autotune"], f"command {init.get('command')}"
    assert init.get("args") == rest, f"args {init.get('args')} != {rest}"
    assert f"--out={table}" in rest, "the expected args do not write the worker's table"
    resources = init.get("resources", {})
    assert resources == worker.get("resources"), f"resources {resources} != {worker.get('resources')}"
    gpu = resources.get("limits", {}).get("nvidia.com/gpu") or resources.get("claims")
    assert gpu, f"initContainer has no GPU: {resources}"
    assert init.get("securityContext") == worker.get("securityContext"), "securityContext differs"
    nccl = [e["name"] for e in init.get("env", []) if e["name"].startswith("NCCL_")]
    assert not nccl, f"initContainer has NCCL variables {nccl}"
    init_mounts = {m["mountPath"]: m for m in init.get("volumeMounts", [])}
    assert AUTOTUNE_DIR in init_mounts and not init_mounts[AUTOTUNE_DIR].get("readOnly"), \
        f"initContainer mounts nothing writable at {AUTOTUNE_DIR}"
    mount = mounts.get(AUTOTUNE_DIR)
    assert mount and mount.get("readOnly"), f"worker mounts nothing read-only at {AUTOTUNE_DIR}"
    assert mount["name"] == init_mounts[AUTOTUNE_DIR]["name"], "worker and initContainer mount different volumes"
    assert "emptyDir" in volumes[mount["name"]], f"volume {volumes[mount['name']]}"
    assert flags == [f"--cost_table={table}"], f"worker's flags {flags}"
    gpu_text = f"nvidia.com/gpu {gpu}" if not isinstance(gpu, list) else f"claims {[c['name'] for c in gpu]}"
    return (f"{kind}: initContainer muonps-autotune ({gpu_text}) writes {table}, "
            f"the worker reads it (--cost_table)")


def main():
    path, kind, source, *rest = sys.argv[1:]
    with open(path) as f:
        objects = json.load(f)
    try:
        print(check(objects, kind, source, rest))
    except AssertionError as e:
        print(f"{path}: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
