"""QK-clip (Kimi K2's MuonClip) for muonps.Muon.

After a step, for every attention layer whose query and key projections
are registered here and every head h whose largest attention logit of the
step, S_h (reported by the model), exceeds `threshold` (tau), the head's
rows of both projections are shrunk so that its logits could not exceed tau:
gamma_h = tau / S_h, W_q[h] *= gamma_h ** alpha, W_k[h] *= gamma_h **
(1 - alpha) (alpha = 0.5: the square root of gamma_h on each). Heads at or
below tau are untouched, and so is the optimizer's momentum.

Projections are [heads * head_dim, in] weights (nn.Linear's layout) with
the same number of query and key heads (multi-head attention); a head's
rows are [h * head_dim, (h + 1) * head_dim).
"""

import math

import torch


class QKClip:
    """`pairs`: {query weight name: (key weight name, heads)}, names as the
    optimizer's parameters are named; `threshold`: tau (> 0)."""

    def __init__(self, pairs, threshold=100.0, alpha=0.5):
        if not (isinstance(threshold, (int, float)) and
                math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"qk_clip threshold: {threshold!r} must be a "
                             "positive finite number")
        if not 0 <= alpha <= 1:
            raise ValueError(f"qk_clip alpha: {alpha!r} is not in [0, 1]")
        self.pairs = {}
        for q, value in dict(pairs).items():
            k, heads = value
            if not (isinstance(heads, int) and heads > 0):
                raise ValueError(f"qk_clip pairs[{q!r}]: heads {heads!r} must "
                                 "be a positive int")
            self.pairs[q] = (k, heads)
        self.threshold = float(threshold)
        self.alpha = float(alpha)

    def check(self, params_by_name):
        """Every named weight exists, is 2-D, and splits into its heads."""
        for q, (k, heads) in self.pairs.items():
            for name in (q, k):
                p = params_by_name.get(name)
                if p is None:
                    raise ValueError(f"qk_clip: no parameter named {name!r}")
                if p.dim() != 2 or p.shape[0] % heads:
                    raise ValueError(
                        f"qk_clip: {name!r} of shape {tuple(p.shape)} is not "
                        f"[heads * head_dim, in] with {heads} heads")
            if params_by_name[q].shape != params_by_name[k].shape:
                raise ValueError(f"qk_clip: {q!r} and {k!r} differ in shape "
                                 "(only equal query and key heads are "
                                 "supported)")

    @torch.no_grad()
    def apply(self, params_by_name, max_logits):
        """Shrinks the heads over the threshold in place (on the parameters'
        device and current stream, after the step's update); `max_logits`:
        {query weight name: per-head maximum logits of the step}. Returns
        how many heads were clipped."""
        clipped = 0
        for q, logits in max_logits.items():
            if q not in self.pairs:
                raise ValueError(f"qk_clip: max_logits names {q!r}, which is "
                                 "not a registered query weight")
            k, heads = self.pairs[q]
            s = torch.as_tensor(logits, dtype=torch.float32).reshape(-1)
            if s.numel() != heads:
                raise ValueError(f"qk_clip: max_logits[{q!r}] has {s.numel()} "
                                 f"values for {heads} heads")
            gamma = torch.clamp(self.threshold / s.clamp_min(1e-30), max=1.0)
            gamma = torch.where(s > self.threshold, gamma, torch.ones_like(gamma))
            clipped += int((gamma < 1).sum())
            for name, power in ((q, self.alpha), (k, 1.0 - self.alpha)):
                w = params_by_name[name]
                rows = w.shape[0] // heads
                scale = gamma.pow(power).to(device=w.device, dtype=w.dtype)
                w.view(heads, rows, -1).mul_(scale.view(heads, 1, 1))
        return clipped
