"""torch.optim.Muon's update written out with torch ops (torch 1.13 has no
Muon class), in any dtype, for the tests to compare muonps.Muon against.

Follows torch/optim/_muon.py: `buf.lerp_(g, 1 - momentum)`; nesterov
update `g.lerp(buf, momentum)`; quintic Newton-Schulz on the wide
orientation after Frobenius normalization (clamped at eps);
`p *= 1 - lr * wd`; `p -= adjusted_lr * update`. Runs NS in the parameter's
dtype (torch runs it in bfloat16).
"""

import math

import torch

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)


def newton_schulz(g, steps, eps=1e-7, coefficients=NS_COEFFICIENTS):
    a, b, c = coefficients
    x = g
    transposed = x.size(0) > x.size(1)
    if transposed:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        update = b * gram + c * (gram @ gram)
        x = a * x + update @ x
    return x.T if transposed else x


def adjusted_lr(lr, adjust_lr_fn, rows, cols):
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(adjust_lr_fn)


class ReferenceMuon:
    """Muon on a dict of tensors (2-D, or 3-D stacks stepped per expert)."""

    def __init__(self, momentum=0.95, nesterov=True, ns_steps=5,
                 adjust_lr_fn=None, ns_coefficients=NS_COEFFICIENTS,
                 ns_eps=1e-7):
        self.momentum, self.nesterov = momentum, nesterov
        self.ns_steps, self.adjust_lr_fn = ns_steps, adjust_lr_fn
        self.ns_coefficients, self.ns_eps = ns_coefficients, ns_eps
        self.buffers = {}

    def step(self, name, param, grad, lr, weight_decay):
        """Steps `param` in place; `grad` has its shape and dtype."""
        stacks = param.unsqueeze(0) if param.dim() == 2 else param
        grads = grad.unsqueeze(0) if grad.dim() == 2 else grad
        for e in range(stacks.size(0)):
            p, g = stacks[e], grads[e]
            buf = self.buffers.setdefault(f"{name}[{e}]", torch.zeros_like(g))
            buf.lerp_(g, 1 - self.momentum)
            update = g.lerp(buf, self.momentum) if self.nesterov else buf
            update = newton_schulz(update, self.ns_steps, self.ns_eps,
                                    self.ns_coefficients)
            p.mul_(1 - lr * weight_decay)
            p.add_(update, alpha=-adjusted_lr(lr, self.adjust_lr_fn, *p.shape))


def relative_error(actual, expected):
    actual = actual.detach().double()
    expected = expected.detach().double()
    return ((actual - expected).norm() / expected.norm().clamp(min=1e-30)).item()
