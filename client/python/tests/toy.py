"""The small model the tests step: two 2-D weights of different aspect
ratios, a 3-D expert stack, and two vectors for AdamW; seeded values and
gradients; and the reference trajectory (reference.py's Muon, torch's
AdamW) for any per-step, per-tensor lr and weight decay."""

import torch

from reference import ReferenceMuon

SHAPES = {"w_tall": (32, 16), "w_wide": (16, 48), "experts": (4, 8, 24),
          "bias": (16,), "scale": (48,)}
MATRICES = ("w_tall", "w_wide", "experts")


def initial(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * 0.1 for n, s in SHAPES.items()}


def gradients(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
            for _ in range(steps)]


def parameters(values):
    return {n: torch.nn.Parameter(v.clone()) for n, v in values.items()}


def set_grads(params, grads):
    for n, p in params.items():
        p.grad = grads[n].clone()


def reference_trajectory(init, grads, dtype, hyper, betas=(0.9, 0.999),
                         eps=1e-8, **muon_kwargs):
    """Parameters after each step; hyper(step, name) -> (lr, weight_decay)."""
    params = {n: v.clone().to(dtype) for n, v in init.items()}
    muon = ReferenceMuon(**muon_kwargs)
    adamw = {n: torch.optim.AdamW([p], betas=betas, eps=eps)
             for n, p in params.items() if n not in MATRICES}
    out = []
    for step, g in enumerate(grads):
        for n in MATRICES:
            muon.step(n, params[n], g[n].to(dtype), *hyper(step, n))
        for n, opt in adamw.items():
            lr, wd = hyper(step, n)
            opt.param_groups[0].update(lr=lr, weight_decay=wd)
            params[n].grad = g[n].to(dtype)
            opt.step()
        out.append({n: p.clone() for n, p in params.items()})
    return out
