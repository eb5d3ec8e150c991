"""muonps.Muon's trajectory against torch.optim.Muon's formula (reference.py)
and torch.optim.AdamW, on one worker, with constant hyperparameters, param
groups and an lr scheduler.

Tolerances: the service runs fp32 Newton-Schulz (NS5 or Gram NS, as the plan
picks) with another summation order than the fp32 reference, so params agree
to ~2e-7 relative and per-step updates to ~2e-6 (measured); 1e-5 and 1e-4
leave margin while a wrong lr, momentum or scaling is off by far more.
"""

import pathlib

import pytest
import torch

import muonps
import toy
from reference import relative_error

STEPS = 5
PARAM_TOLERANCE = 1e-5
UPDATE_TOLERANCE = 1e-4


def check_trajectory(opt, params, init, grads, hyper, after_step=None,
                     **reference_kwargs):
    """Steps `opt` (then calls after_step) and compares every tensor after
    every step; returns the fp64 reference trajectory."""
    ref32 = toy.reference_trajectory(init, grads, torch.float32, hyper,
                                     **reference_kwargs)
    ref64 = toy.reference_trajectory(init, grads, torch.float64, hyper,
                                     **reference_kwargs)
    before = {n: v.double() for n, v in init.items()}
    for step, g in enumerate(grads):
        toy.set_grads(params, g)
        opt.step()
        if after_step is not None:
            after_step()
        for n, p in params.items():
            at = f"{n} after step {step}"
            assert relative_error(p, ref32[step][n]) <= PARAM_TOLERANCE, at
            assert relative_error(p, ref64[step][n]) <= PARAM_TOLERANCE, at
            update = p.detach().double() - before[n]
            expected = ref64[step][n] - (ref64[step - 1][n] if step else before[n])
            assert relative_error(update, expected) <= UPDATE_TOLERANCE, at
        before = {n: p.detach().double() for n, p in params.items()}
    return ref64


@pytest.mark.parametrize("layout", ["replicated", "unreduced"])
def test_trajectory_matches_torch_muon_formula_in_fp32_and_fp64(cluster, layout):
    c = cluster()
    init, grads = toy.initial(), toy.gradients(STEPS)
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), lr=0.02, weight_decay=0.1,
                      adamw_lr=0.01, adamw_weight_decay=0.01, layout=layout,
                      **c.options())

    def hyper(step, name):
        return (0.02, 0.1) if name in toy.MATRICES else (0.01, 0.01)

    check_trajectory(opt, params, init, grads, hyper)
    opt.close()


def test_dedicated_workers_own_matrices_on_the_same_trajectory(cluster):
    # Two workers with no trainer (muonps-worker --dedicated) join the one
    # with the trainer: the matrices spread over all three, the trajectory
    # is the same.
    c = cluster(dedicated=2)
    init, grads = toy.initial(seed=8), toy.gradients(STEPS, seed=9)
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), lr=0.02, weight_decay=0.1,
                      adamw_lr=0.01, adamw_weight_decay=0.01, **c.options())

    def hyper(step, name):
        return (0.02, 0.1) if name in toy.MATRICES else (0.01, 0.01)

    check_trajectory(opt, params, init, grads, hyper)
    opt.close()
    for i in range(2):
        log = pathlib.Path(c.log_dir / f"{c.job}-worker-d{i}.log").read_text()
        assert "(dedicated) first step" in log, log


def test_match_rms_adamw_without_nesterov_matches_reference(cluster):
    c = cluster()
    init, grads = toy.initial(seed=2), toy.gradients(STEPS, seed=3)
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), lr=0.01, weight_decay=0.05,
                      momentum=0.9, nesterov=False, ns_steps=3,
                      adjust_lr_fn="match_rms_adamw", adamw_betas=(0.8, 0.95),
                      adamw_eps=1e-6, adamw_weight_decay=0.0, **c.options())

    def hyper(step, name):
        return (0.01, 0.05) if name in toy.MATRICES else (0.01, 0.0)

    check_trajectory(opt, params, init, grads, hyper, betas=(0.8, 0.95),
                     eps=1e-6, momentum=0.9, nesterov=False, ns_steps=3,
                     adjust_lr_fn="match_rms_adamw")
    opt.close()


@pytest.mark.parametrize("ns_algorithm", ["ns5", "gram"])
def test_momentum_zero_own_coefficients_and_forced_algorithm(cluster,
                                                             ns_algorithm):
    # momentum=0 is torch.optim.Muon's plain orthogonalized gradient, not a
    # request for the default; coefficients and eps reach the owners.
    c = cluster()
    init, grads = toy.initial(seed=4), toy.gradients(STEPS, seed=5)
    params = toy.parameters(init)
    coefficients, eps = (3.0, -3.2, 1.2), 1e-5
    opt = muonps.Muon(list(params.items()), lr=0.02, weight_decay=0.1,
                      momentum=0.0, ns_coefficients=coefficients, eps=eps,
                      ns_algorithm=ns_algorithm, adamw_weight_decay=0.01,
                      **c.options())

    def hyper(step, name):
        return (0.02, 0.1) if name in toy.MATRICES else (0.02, 0.01)

    check_trajectory(opt, params, init, grads, hyper, momentum=0.0,
                     ns_coefficients=coefficients, ns_eps=eps)
    opt.close()


def grouped_optimizer(c, params):
    """Three groups: own Muon lr/wd, and AdamW with its own lr and decay."""
    groups = [
        {"params": [("w_tall", params["w_tall"])]},
        {"params": [("w_wide", params["w_wide"]),
                    ("experts", params["experts"])],
         "lr": 0.005, "weight_decay": 0.3},
        {"params": [("bias", params["bias"])], "adamw_lr": 0.003,
         "adamw_weight_decay": 0.05},
        {"params": [("scale", params["scale"])], "lr": 0.01},
    ]
    return muonps.Muon(groups, lr=0.02, weight_decay=0.1,
                       adamw_weight_decay=0.01, **c.options())


def grouped_hyper(factor):
    """The groups' (lr, wd) per tensor with lrs scaled by factor(step)."""
    table = {"w_tall": (0.02, 0.1), "w_wide": (0.005, 0.3),
             "experts": (0.005, 0.3), "bias": (0.003, 0.05),
             "scale": (0.01, 0.01)}
    return lambda step, name: (table[name][0] * factor(step), table[name][1])


def test_param_groups_apply_their_own_lr_and_weight_decay(cluster):
    c = cluster()
    init, grads = toy.initial(seed=4), toy.gradients(STEPS, seed=5)
    params = toy.parameters(init)
    opt = grouped_optimizer(c, params)
    check_trajectory(opt, params, init, grads, grouped_hyper(lambda s: 1.0))
    opt.close()


def test_step_lr_scheduler_halves_every_groups_lr_every_two_steps(cluster):
    c = cluster()
    init, grads = toy.initial(seed=6), toy.gradients(STEPS, seed=7)
    params = toy.parameters(init)
    opt = grouped_optimizer(c, params)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []

    def schedule():
        lrs.append(opt.param_groups[0]["lr"])
        scheduler.step()

    ref64 = check_trajectory(opt, params, init, grads,
                             grouped_hyper(lambda s: 0.5 ** (s // 2)),
                             after_step=schedule)
    assert lrs == pytest.approx([0.02, 0.02, 0.01, 0.01, 0.005])
    unscheduled = toy.reference_trajectory(init, grads, torch.float64,
                                           grouped_hyper(lambda s: 1.0))
    for n in params:
        # The schedule made a difference far above the tolerance.
        assert relative_error(ref64[-1][n], unscheduled[-1][n]) > 100 * PARAM_TOLERANCE
    opt.close()


def torch_grouped(init):
    """torch.optim.Muon (one per Muon group; a 3-D stack as one parameter
    per expert, torch's Muon taking 2-D ones) and one torch.optim.AdamW
    with grouped_optimizer's AdamW groups, over copies of `init`."""
    params = {n: torch.nn.Parameter(v.clone()) for n, v in init.items()
              if n != "experts"}
    experts = [torch.nn.Parameter(e.clone()) for e in init["experts"]]
    optimizers = [
        torch.optim.Muon([params["w_tall"]], lr=0.02, weight_decay=0.1),
        torch.optim.Muon([params["w_wide"], *experts], lr=0.005,
                         weight_decay=0.3),
        torch.optim.AdamW([
            {"params": [params["bias"]], "lr": 0.003, "weight_decay": 0.05},
            {"params": [params["scale"]], "lr": 0.01, "weight_decay": 0.01}]),
    ]
    return params, experts, optimizers


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"),
                    reason="needs torch.optim.Muon (torch >= 2.9)")
def test_param_groups_follow_torch_muon_and_adamw_per_group(cluster):
    # Each group's lr and weight decay (Muon's on the workers, AdamW's in
    # the client), registered at start and passed by index every step,
    # against torch's own optimizers with the same groups. torch runs
    # Newton-Schulz in bf16: within the golden tolerance (5e-3) or twice
    # torch's own drift from the float64 formula, whichever is larger.
    c = cluster()
    init, grads = toy.initial(seed=12), toy.gradients(STEPS, seed=13)
    params = toy.parameters(init)
    opt = grouped_optimizer(c, params)
    theirs, experts, optimizers = torch_grouped(init)
    exact = toy.reference_trajectory(init, grads, torch.float64,
                                     grouped_hyper(lambda s: 1.0))
    for step, g in enumerate(grads):
        toy.set_grads(params, g)
        opt.step()
        for n, p in theirs.items():
            p.grad = g[n].clone()
        for e, p in enumerate(experts):
            p.grad = g["experts"][e].clone()
        for o in optimizers:
            o.step()
        mine = {n: p.detach().double() for n, p in params.items()}
        torch_values = {n: p.detach().double() for n, p in theirs.items()}
        torch_values["experts"] = torch.stack(
            [p.detach().double() for p in experts])
        for n in mine:
            drift = relative_error(torch_values[n], exact[step][n])
            error = relative_error(mine[n], torch_values[n])
            assert error <= max(5e-3, 2 * drift), (
                f"{n} after step {step}: {error:.2e} from torch, which is "
                f"{drift:.2e} from the float64 formula")
    opt.close()
