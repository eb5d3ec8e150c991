#!/usr/bin/env python3
"""Makes (or checks) PyTorch's golden optimizer trajectories in this folder.

Needs torch >= 2.9 (torch.optim.Muon); the committed set was made with
torch 2.11 on an NVIDIA H200 (manifest.json's "source").

  # A fresh set: seeded inputs, torch's own optimizers, manifest and tensors.
  python3 make_golden.py --out /tmp/golden --device cuda

  # Recompute every output of a set from its own inputs with the installed
  # torch and print, per case, the largest relative difference.
  python3 make_golden.py --verify testdata/torch_optim_golden --device cuda

Regenerating replaces the inputs too, so the replays' tolerances
(tools/golden_replay/golden_replay.h) must be rechecked against the new set:
run `bazel run //tools/golden_replay -- --golden $PWD/<new folder>` for ns5
and gram before committing it.
"""

import argparse
import json
import pathlib
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("make_golden.py needs numpy (pip install numpy, or apt-get install python3-numpy)")

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
NS_EPS = 1e-7
SEED = 1234
STEPS = 4

# (name, shape, torch.optim.Muon arguments).
MUON_CASES = [
    ("muon0", [64, 32], dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original")),
    ("muon1", [32, 64], dict(lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original")),
    ("muon2", [128, 128], dict(lr=0.01, weight_decay=0.01, momentum=0.9, nesterov=False, ns_steps=5, adjust_lr_fn="match_rms_adamw")),
    ("muon3", [257, 96], dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw")),
    ("muon4", [96, 257], dict(lr=0.05, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=3, adjust_lr_fn="original")),
    ("muon5", [1, 300], dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original")),
    ("muon6", [192, 576], dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw")),
    ("muon7", [384, 96], dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original")),
]
ADAMW_CASES = [
    ("adamw0", [300], dict(lr=0.001, betas=[0.9, 0.999], eps=1e-08, weight_decay=0.01)),
    ("adamw1", [64, 48], dict(lr=0.0003, betas=[0.9, 0.95], eps=1e-08, weight_decay=0.1)),
]
NS_CASES = [("ns0", [64, 64]), ("ns1", [48, 200]), ("ns2", [300, 40])]


def torch_or_exit():
    try:
        import torch
    except ImportError:
        sys.exit("make_golden.py needs torch >= 2.9 (pip install torch)")
    if not hasattr(torch.optim, "Muon"):
        sys.exit(f"make_golden.py needs torch >= 2.9 for torch.optim.Muon; this is torch {torch.__version__}")
    return torch


def newton_schulz(torch, x, ns_steps):
    """torch.optim.Muon's own orthogonalization (bfloat16, tall inputs transposed)."""
    from torch.optim import _muon
    return _muon._zeropower_via_newtonschulz(x, NS_COEFFICIENTS, ns_steps, NS_EPS)


def trajectory(torch, kind, hyper, p0, grads, device):
    """Params (and momentum buffers for Muon) after each of the steps."""
    p = torch.nn.Parameter(torch.from_numpy(p0).to(device))
    if kind == "muon":
        opt = torch.optim.Muon([p], **hyper)
    else:
        h = dict(hyper, betas=tuple(hyper["betas"]))
        opt = torch.optim.AdamW([p], **h)
    params, momenta = [], []
    for g in grads:
        p.grad = torch.from_numpy(g).to(device)
        opt.step()
        params.append(p.detach().float().cpu().numpy().copy())
        if kind == "muon":
            momenta.append(opt.state[p]["momentum_buffer"].float().cpu().numpy().copy())
    return params, momenta


def write(folder, name, array):
    np.ascontiguousarray(array, dtype="<f4").tofile(folder / name)
    return name


def make(out, device):
    torch = torch_or_exit()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    cases = []
    for kind, table in (("muon", MUON_CASES), ("adamw", ADAMW_CASES)):
        for name, shape, hyper in table:
            p0 = (0.02 * rng.standard_normal(shape)).astype(np.float32)
            grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(STEPS)]
            params, momenta = trajectory(torch, kind, hyper, p0, grads, device)
            steps = []
            for i in range(STEPS):
                step = {"grad": write(out, f"{name}_g{i}.bin", grads[i]),
                        "param": write(out, f"{name}_p{i + 1}.bin", params[i])}
                if kind == "muon":
                    step["momentum"] = write(out, f"{name}_m{i + 1}.bin", momenta[i])
                steps.append(step)
            cases.append({"kind": kind, "name": name, "shape": shape, "hyper": hyper,
                          "steps": steps, "p0": write(out, f"{name}_p0.bin", p0)})
    for name, shape in NS_CASES:
        x = rng.standard_normal(shape).astype(np.float32)
        y = newton_schulz(torch, torch.from_numpy(x).to(device), 5).float().cpu().numpy()
        cases.append({"kind": "newton_schulz", "name": name, "shape": shape,
                      "coefficients": list(NS_COEFFICIENTS), "ns_steps": 5, "eps": NS_EPS,
                      "input": write(out, f"{name}_in.bin", x),
                      "output": write(out, f"{name}_out.bin", y)})
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    manifest = {"source": f"torch {torch.__version__} on {device} ({name})", "seed": SEED,
                "dtype": "float32 little-endian row-major",
                "note": "torch.optim.Muon runs Newton-Schulz in bfloat16", "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {out}")


def read(folder, name, shape):
    return np.fromfile(folder / name, dtype="<f4").reshape(shape)


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def verify(folder, device):
    torch = torch_or_exit()
    manifest = json.loads((folder / "manifest.json").read_text())
    print(f"set made by: {manifest['source']}; recomputed with torch {torch.__version__} on {device}")
    worst = 0.0
    for case in manifest["cases"]:
        shape = case["shape"]
        if case["kind"] == "newton_schulz":
            x = torch.from_numpy(read(folder, case["input"], shape)).to(device)
            y = newton_schulz(torch, x, case["ns_steps"]).float().cpu().numpy()
            err = rel_err(y, read(folder, case["output"], shape))
        else:
            p0 = read(folder, case["p0"], shape)
            grads = [read(folder, s["grad"], shape) for s in case["steps"]]
            params, momenta = trajectory(torch, case["kind"], case["hyper"], p0, grads, device)
            err = max(rel_err(params[i], read(folder, s["param"], shape))
                      for i, s in enumerate(case["steps"]))
            if case["kind"] == "muon":
                err = max([err] + [rel_err(momenta[i], read(folder, s["momentum"], shape))
                                   for i, s in enumerate(case["steps"])])
        worst = max(worst, err)
        print(f"{case['name']:8s} {case['kind']:14s} max rel diff {err:.3e}")
    print(f"largest relative difference over {len(manifest['cases'])} cases: {worst:.3e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=pathlib.Path, help="folder for a fresh set")
    mode.add_argument("--verify", type=pathlib.Path, help="a set to recompute and compare")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    args = parser.parse_args()
    if args.out:
        make(args.out, args.device)
    else:
        verify(args.verify, args.device)


if __name__ == "__main__":
    main()
