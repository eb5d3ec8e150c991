"""PyTorch's own trajectories (testdata/torch_optim_golden, made by
torch 2.11's torch.optim.Muon and AdamW) replayed through muonps.Muon on a
one-worker cluster.

Tolerances from the golden README: torch runs Newton-Schulz in bfloat16, so
fp32 params agree to ~2e-3 relative after 4 steps (5e-3 here, after every
step); momentum and AdamW do not go through NS and agree to ~1e-7 (1e-6).
"""

import json

import numpy as np
import pytest
import torch

import muonps
from conftest import GOLDEN
from reference import relative_error

PARAM_TOLERANCE = 5e-3
STATE_TOLERANCE = 1e-6


def manifest_cases(kind):
    path = GOLDEN / "manifest.json"
    if not path.is_file():
        return [pytest.param(None, marks=pytest.mark.skip(f"no {path}"))]
    cases = json.loads(path.read_text())["cases"]
    return [pytest.param(c, id=c["name"]) for c in cases if c["kind"] == kind]


def load(name, shape):
    values = np.fromfile(GOLDEN / name, dtype="<f4")
    return torch.from_numpy(values.reshape(shape).copy())


@pytest.mark.parametrize("case", manifest_cases("muon"))
def test_muon_golden_params_within_5e3_and_momentum_within_1e6(cluster, case):
    c = cluster()
    h = case["hyper"]
    name = case["name"]
    param = torch.nn.Parameter(load(case["p0"], case["shape"]))
    opt = muonps.Muon([(name, param)], lr=h["lr"],
                      weight_decay=h["weight_decay"], momentum=h["momentum"],
                      nesterov=h["nesterov"], ns_steps=h["ns_steps"],
                      adjust_lr_fn=h["adjust_lr_fn"], **c.options())
    for step, files in enumerate(case["steps"]):
        param.grad = load(files["grad"], case["shape"])
        opt.step()
        error = relative_error(param, load(files["param"], case["shape"]))
        assert error <= PARAM_TOLERANCE, f"param after step {step}: {error:.2e}"
        momentum = opt.state_dict()["muonps"]["momentum"][f"{name}[0]"]
        error = relative_error(momentum, load(files["momentum"], case["shape"]))
        assert error <= STATE_TOLERANCE, f"momentum after step {step}: {error:.2e}"
    opt.close()


@pytest.mark.parametrize("case", manifest_cases("adamw"))
def test_adamw_golden_params_within_1e6(cluster, case):
    c = cluster()
    h = case["hyper"]
    param = torch.nn.Parameter(load(case["p0"], case["shape"]))
    # A job needs a matrix: a constant one, beside the AdamW tensor.
    anchor = torch.nn.Parameter(torch.ones(4, 4))
    opt = muonps.Muon([("anchor", anchor), (case["name"], param)],
                      adamw_lr=h["lr"], adamw_betas=tuple(h["betas"]),
                      adamw_eps=h["eps"], adamw_weight_decay=h["weight_decay"],
                      is_matrix=lambda n, p: n == "anchor", **c.options())
    for step, files in enumerate(case["steps"]):
        param.grad = load(files["grad"], case["shape"])
        anchor.grad = torch.zeros(4, 4)
        opt.step()
        error = relative_error(param, load(files["param"], case["shape"]))
        assert error <= STATE_TOLERANCE, f"param after step {step}: {error:.2e}"
    opt.close()
