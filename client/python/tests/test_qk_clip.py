"""QK-clip (Kimi K2's MuonClip) against the formula written out here: after
each Muon step, every head whose reported max logit S_h exceeds tau has its
query rows scaled by sqrt(tau / S_h) and its key rows by the same; heads
below tau and the momentum are untouched."""

import pytest
import torch

import muonps
from reference import ReferenceMuon, relative_error

HEADS, HEAD_DIM, WIDTH = 4, 8, 16
TAU = 50.0


def clip_reference(q, k, logits):
    for h in range(HEADS):
        if logits[h] > TAU:
            scale = (TAU / logits[h]) ** 0.5
            rows = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            q[rows] *= scale
            k[rows] *= scale


def test_heads_over_the_threshold_shrink_as_k2_says(cluster):
    c = cluster()
    g = torch.Generator().manual_seed(3)
    init = {n: torch.randn(HEADS * HEAD_DIM, WIDTH, generator=g) * 0.2
            for n in ("attn.q", "attn.k")}
    params = {n: torch.nn.Parameter(v.clone()) for n, v in init.items()}
    opt = muonps.Muon(list(params.items()), lr=0.02, weight_decay=0.1,
                      qk_clip=muonps.QKClip({"attn.q": ("attn.k", HEADS)},
                                            threshold=TAU),
                      **c.options())
    ref = {n: v.clone().double() for n, v in init.items()}
    muon = ReferenceMuon()
    clipped_any = False
    for step in range(5):
        grads = {n: torch.randn(v.shape, generator=g) for n, v in init.items()}
        logits = [30.0, 80.0 + 10 * step, 49.9, 200.0 if step % 2 else 10.0]
        clipped_any |= any(s > TAU for s in logits)
        for n, p in params.items():
            p.grad = grads[n].clone()
        opt.step(max_logits={"attn.q": torch.tensor(logits)})
        for n in ref:
            muon.step(n, ref[n], grads[n].double(), 0.02, 0.1)
        clip_reference(ref["attn.q"], ref["attn.k"], logits)
        for n, p in params.items():
            assert relative_error(p, ref[n]) <= 1e-5, f"{n} after step {step}"
    assert clipped_any
    opt.close()


def test_bad_qk_clip_input_names_the_problem():
    with pytest.raises(ValueError, match="threshold"):
        muonps.QKClip({"q": ("k", 4)}, threshold=float("nan"))
    with pytest.raises(ValueError, match="heads"):
        muonps.QKClip({"q": ("k", 0)})
    clip = muonps.QKClip({"q": ("k", 3)})
    with pytest.raises(ValueError, match="3 heads"):
        clip.check({"q": torch.zeros(8, 4), "k": torch.zeros(8, 4)})
    clip = muonps.QKClip({"q": ("k", 2)})
    with pytest.raises(ValueError, match="no parameter named 'k'"):
        clip.check({"q": torch.zeros(8, 4)})
    weights = {"q": torch.ones(8, 4), "k": torch.ones(8, 4)}
    with pytest.raises(ValueError, match="2 heads"):
        clip.apply(weights, {"q": [1.0, 2.0, 3.0]})
    assert clip.apply(weights, {"q": [400.0, 1.0]}) == 1
    assert torch.allclose(weights["q"][:4], torch.full((4, 4), 0.5))
    assert torch.equal(weights["k"][4:], torch.ones(4, 4))
