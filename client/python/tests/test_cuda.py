"""muonps.Muon on CUDA parameters against torch.optim.Muon and AdamW.

Runs where a GPU and a torch with torch.optim.Muon exist (the GPU machine:
`deploy/device/run_gpu_step_suite.sh` runs it); skipped elsewhere. A worker
--device cuda:0 updates the model's matrices in place; biases go through
torch's AdamW. Over 10 steps with two param groups of their own lr and
weight decay, every parameter stays within the golden tolerance (5e-3
relative: torch runs Newton-Schulz in bf16, as the worker does by
default) of torch's own optimizers fed the same gradients.
"""

import json
import pathlib
import subprocess
import sys

import pytest
import torch

import muonps
from reference import relative_error

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not hasattr(torch.optim, "Muon"),
    reason="needs a GPU and torch.optim.Muon")

SHAPES = {"a.weight": (96, 64), "b.weight": (64, 160), "c.weight": (128, 128),
          "d.weight": (160, 96)}


def model(seed):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in SHAPES.items():
        params[name] = torch.nn.Parameter(
            (torch.randn(shape, generator=g) * 0.05).cuda())
        params[name.replace("weight", "bias")] = torch.nn.Parameter(
            (torch.randn(shape[0], generator=g) * 0.05).cuda())
    return params


def groups(params, names):
    """Two groups: a/b with lr 0.02, wd 0.1; c/d with lr 0.01, wd 0.05."""
    first = [n for n in names if n[0] in "ab"]
    second = [n for n in names if n[0] in "cd"]
    return [{"params": [(n, params[n]) for n in first], "lr": 0.02,
             "weight_decay": 0.1, "adamw_weight_decay": 0.01},
            {"params": [(n, params[n]) for n in second], "lr": 0.01,
             "weight_decay": 0.05, "adamw_weight_decay": 0.02}]


def torch_groups(params, fused=False):
    """torch.optim.Muon and AdamW over `params` with groups()'s two groups
    (AdamW fused or not)."""
    matrices = [n for n in params if n.endswith("weight")]
    vectors = [n for n in params if n.endswith("bias")]
    return [
        torch.optim.Muon([params[n] for n in matrices if n[0] in "ab"],
                         lr=0.02, weight_decay=0.1),
        torch.optim.Muon([params[n] for n in matrices if n[0] in "cd"],
                         lr=0.01, weight_decay=0.05),
        torch.optim.AdamW([
            {"params": [params[n] for n in vectors if n[0] in "ab"],
             "weight_decay": 0.01, "lr": 0.02},
            {"params": [params[n] for n in vectors if n[0] in "cd"],
             "weight_decay": 0.02, "lr": 0.01}], fused=fused)]


@pytest.mark.parametrize("sync_each_step,dedicated",
                         [(False, 0), (True, 0), (False, 1)])
def test_cuda_parameters_follow_torch_optim_muon_per_group(
        cluster, sync_each_step, dedicated):
    """dedicated=1: a worker with no trainer (--dedicated, a dedicated
    optimizer pool; here sharing the one GPU over the CUDA IPC transport)
    joins the trainer's worker and owns matrices too."""
    if dedicated:
        c = cluster(workers=1, device="cuda:0",
                    worker_args=("--gpu_transport", "ipc"), dedicated=1)
    else:
        c = cluster(workers=1, device="cuda:0")
    ours, theirs = model(3), model(3)
    opt = muonps.Muon(groups(ours, list(ours)), **c.options())
    matrices = [n for n in theirs if n.endswith("weight")]
    reference = torch_groups(theirs)
    g = torch.Generator().manual_seed(11)
    worst = 0.0
    for step in range(10):
        for n in ours:
            grad = torch.randn(ours[n].shape, generator=g).cuda()
            ours[n].grad = grad.clone()
            theirs[n].grad = grad.clone()
        opt.step()
        if sync_each_step:
            opt.synchronize()
        for r in reference:
            r.step()
        torch.cuda.synchronize()
        for n in ours:
            error = relative_error(ours[n].detach().double().cpu(),
                                   theirs[n].detach().double().cpu())
            worst = max(worst, error)
            assert error <= 5e-3, f"step {step} {n}: {error:.2e}"
        opt.zero_grad()
    opt.synchronize()
    print(f'{{"what":"python_cuda_vs_torch_muon","steps":10,'
          f'"dedicated_workers":{dedicated},"max_rel_err":{worst:.3e}}}')
    if dedicated:
        log = (c.log_dir / f"{c.job}-worker-d0.log").read_text()
        assert "(dedicated) first step" in log, log
        opt.close()  # state_dict holds the local worker's momentum only
        return
    # Momentum held on the worker, through state_dict, equals torch's.
    state = opt.state_dict()["muonps"]["momentum"]
    for n in matrices:
        torch_buf = next(r.state[theirs[n]]["momentum_buffer"]
                         for r in reference[:2] if theirs[n] in r.state)
        assert relative_error(state[f"{n}[0]"].double(),
                              torch_buf.double().cpu()) <= 1e-5, n
    opt.close()


def test_nan_gradient_is_refused_on_the_gpu_with_nothing_changed(cluster):
    c = cluster(workers=1, device="cuda:0")
    ours = model(5)
    opt = muonps.Muon(list(ours.items()), lr=0.02, **c.options())
    for p in ours.values():
        p.grad = torch.ones_like(p)
    opt.step()
    opt.synchronize()
    before = {n: p.detach().clone() for n, p in ours.items()}
    for p in ours.values():
        p.grad = torch.ones_like(p)
    ours["b.weight"].grad[3, 7] = float("nan")
    opt.step()
    with pytest.raises(muonps.MuonpsError, match=r"b\.weight.*NaN"):
        opt.synchronize()
    for n in SHAPES:
        assert torch.equal(ours[n].detach(), before[n]), n
    opt.close()


def test_bf16_parameters_stay_as_close_to_fp32_as_torch_does(cluster):
    """bf16 parameters: the worker keeps fp32 momentum and rounds each
    updated parameter once, so over 10 steps it stays at least as close to
    the fp32 trajectory (torch.optim.Muon on fp32 copies fed the same bf16
    gradients) as torch.optim.Muon on the bf16 parameters does. (torch
    rounds twice per step, p * (1 - lr * wd) and then the update, and the
    first rounding mostly undoes the decay; 5e-3 of fp32 is beyond any bf16
    run: storing a parameter in bf16 costs ~1e-3 per rounding.) The biases
    go through the same fused AdamW on both sides and match exactly."""
    c = cluster(workers=1, device="cuda:0")
    start = model(7)
    ours = {n: torch.nn.Parameter(p.detach().bfloat16()) for n, p in start.items()}
    torch_bf16 = {n: torch.nn.Parameter(p.detach().clone())
                  for n, p in ours.items()}
    fp32 = {n: torch.nn.Parameter(p.detach().float()) for n, p in ours.items()}
    opt = muonps.Muon(groups(ours, list(ours)), **c.options())
    matrices = [n for n in ours if n.endswith("weight")]
    vectors = [n for n in ours if n.endswith("bias")]
    references = (torch_groups(torch_bf16, fused=True) +
                  torch_groups(fp32, fused=True))
    g = torch.Generator().manual_seed(13)
    worst_ours, worst_torch = 0.0, 0.0
    for step in range(10):
        for n in ours:
            grad = torch.randn(ours[n].shape, generator=g).bfloat16().cuda()
            ours[n].grad = grad.clone()
            torch_bf16[n].grad = grad.clone()
            fp32[n].grad = grad.float()
        opt.step()
        for r in references:
            r.step()
        opt.synchronize()
        torch.cuda.synchronize()
        for n in matrices:
            truth = fp32[n].detach().double().cpu()
            mine = relative_error(ours[n].detach().double().cpu(), truth)
            theirs = relative_error(torch_bf16[n].detach().double().cpu(), truth)
            worst_ours, worst_torch = max(worst_ours, mine), max(worst_torch, theirs)
            assert mine <= 1.1 * theirs + 1e-3, (
                f"step {step} {n}: {mine:.2e} from fp32, torch bf16 {theirs:.2e}")
        for n in vectors:
            assert torch.equal(ours[n].detach(), torch_bf16[n].detach()), n
        opt.zero_grad()
        for params in (torch_bf16, fp32):
            for p in params.values():
                p.grad = None
    print(f'{{"what":"python_cuda_bf16_vs_fp32_trajectory","steps":10,'
          f'"muonps_max_rel_err":{worst_ours:.3e},'
          f'"torch_muon_bf16_max_rel_err":{worst_torch:.3e}}}')
    for p in ours.values():
        assert p.dtype == torch.bfloat16
    opt.close()


def test_moe_experts_match_per_expert_torch_muon_with_qk_clip(cluster):
    """A MoE layer's 3-D expert weight [8, out, in] is one stack on the GPU
    worker, orthogonalized per expert: the same as eight torch.optim.Muon
    matrices. And QK-clip on CUDA parameters lands after the step's update
    (the trainer's stream waits for the worker): the same as the formula
    applied to torch's result. The worker runs fp32 Newton-Schulz here, so
    the difference is torch's own bf16 rounding (two bf16 implementations
    drift apart by ~5e-3 in 10 steps on these shapes)."""
    c = cluster(workers=1, device="cuda:0",
                worker_args=("--precision", "fp32"))
    g = torch.Generator().manual_seed(23)
    experts0 = torch.randn(8, 64, 32, generator=g) * 0.05
    q0, k0 = (torch.randn(64, 32, generator=g) * 0.2 for _ in range(2))
    ours = {"moe.experts": torch.nn.Parameter(experts0.clone().cuda()),
            "attn.q": torch.nn.Parameter(q0.clone().cuda()),
            "attn.k": torch.nn.Parameter(k0.clone().cuda())}
    experts = [torch.nn.Parameter(experts0[e].clone().cuda()) for e in range(8)]
    q, k = (torch.nn.Parameter(t.clone().cuda()) for t in (q0, k0))
    opt = muonps.Muon(list(ours.items()), lr=0.02, weight_decay=0.1,
                      qk_clip=muonps.QKClip({"attn.q": ("attn.k", 4)},
                                            threshold=50.0), **c.options())
    reference = torch.optim.Muon([*experts, q, k], lr=0.02, weight_decay=0.1)
    worst = 0.0
    for step in range(10):
        grads = {n: torch.randn(p.shape, generator=g).cuda()
                 for n, p in ours.items()}
        for n, p in ours.items():
            p.grad = grads[n].clone()
        for e in range(8):
            experts[e].grad = grads["moe.experts"][e].clone()
        q.grad, k.grad = grads["attn.q"].clone(), grads["attn.k"].clone()
        logits = torch.tensor([10.0, 60.0 + step, 400.0, 49.0])
        opt.step(max_logits={"attn.q": logits})
        reference.step()
        with torch.no_grad():
            for h in range(4):
                if logits[h] > 50.0:
                    scale = (50.0 / logits[h].item()) ** 0.5
                    q[h * 16:(h + 1) * 16] *= scale
                    k[h * 16:(h + 1) * 16] *= scale
        opt.synchronize()
        pairs = [(ours["moe.experts"][e], experts[e]) for e in range(8)]
        pairs += [(ours["attn.q"], q), (ours["attn.k"], k)]
        for mine, theirs in pairs:
            error = relative_error(mine.detach().double().cpu(),
                                   theirs.detach().double().cpu())
            worst = max(worst, error)
            assert error <= 5e-3, f"step {step}: {error:.2e}"
    opt.close()
    print(f'{{"what":"python_cuda_moe_qk_clip_vs_torch_muon","experts":8,'
          f'"steps":10,"max_rel_err":{worst:.3e}}}')


@pytest.mark.skipif(
    not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"),
    reason="needs torch >= 2.1 (post-accumulate-grad hooks)")
def test_gradients_from_backward_follow_torch_when_clipped_after_it(cluster):
    """Gradients from backward over two micro-batches: each matrix's hook
    marks it ready as backward accumulates it, so the worker may start on
    it during backward. On even steps clip_grad_norm_ rescales every
    gradient in place after the hooks, late on the device (the step marks
    them again). Steps are left in flight while the next backward marks
    its gradients. torch.optim.Muon, on its own copy of the parameters, is
    fed each step's final gradients (after the clip): after 10 steps the
    parameters are within the golden tolerance of its (a step that read a
    gradient before its clip would mix momentum at the wrong scale)."""
    c = cluster(workers=1, device="cuda:0")

    def matrices():
        g = torch.Generator().manual_seed(29)
        return {n: torch.nn.Parameter(
            (torch.randn(shape, generator=g) * 0.05).cuda())
            for n, shape in SHAPES.items()}

    ours, theirs = matrices(), matrices()
    # lr 0.01, as the first case's second group: the two bf16 Newton-Schulz
    # implementations part in proportion to the lr.
    opt = muonps.Muon(list(ours.items()), lr=0.01, weight_decay=0.1,
                      **c.options())
    # Not on by default (bench/train_step measured no gain on 2 x H200).
    assert not opt._cuda.hooks
    opt._cuda.hook_gradients()
    assert len(opt._cuda.hooks) == len(SHAPES)
    reference = torch.optim.Muon(list(theirs.values()), lr=0.01,
                                 weight_decay=0.1)
    g = torch.Generator().manual_seed(31)
    # About half the gradients' norm (~310): each clip halves them.
    max_norm, norms = 150.0, []
    for step in range(10):
        opt.zero_grad()
        # Full-rank gradients, as in the other cases: on nearly singular
        # ones two bf16 Newton-Schulz implementations part further.
        for _ in range(2):
            weights = {n: torch.randn(shape, generator=g).cuda()
                       for n, shape in SHAPES.items()}
            sum((ours[n] * weights[n]).sum() for n in SHAPES).backward()
        if step % 2 == 0:
            # The clip lands well after the hooks' marks on the device: a
            # step that waited for those alone would read unclipped values.
            torch.cuda._sleep(50_000_000)
            norms.append(
                torch.nn.utils.clip_grad_norm_(ours.values(), max_norm))
        for n in SHAPES:
            theirs[n].grad = ours[n].grad.detach().clone()
        opt.step()
        reference.step()
    opt.synchronize()
    torch.cuda.synchronize()
    assert all(norm.item() > max_norm for norm in norms)  # clipped
    worst = 0.0
    for n in SHAPES:
        error = relative_error(ours[n].detach().double().cpu(),
                               theirs[n].detach().double().cpu())
        worst = max(worst, error)
        assert error <= 5e-3, f"{n}: {error:.2e}"
    opt.close()
    assert not opt._cuda.hooks
    print(f'{{"what":"python_cuda_backward_hooks_vs_torch_muon","steps":10,'
          f'"max_rel_err":{worst:.3e}}}')


class _Layers(torch.nn.Module):
    """Eight bias-free linear layers with a tanh between them."""

    def __init__(self, seed, width=1024):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(width, width, bias=False) for _ in range(8))
        for layer in self.layers:
            layer.weight.data = torch.randn(width, width, generator=g) * 0.03

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _train_layers(options, forward_waits=False, expandable_after_start=False,
                  wrap=None):
    """12 steps of _Layers(41) on the same batches under muonps.Muon with
    `options`: the losses, the weights, which gradient buffers the
    optimizer made (none lent: CudaPath.grads) and which of them were
    written (CudaPath.dirty). `expandable_after_start`:
    once the optimizer lent its buffers, new memory comes from expandable
    segments (in a process of its own: the setting stays). `wrap`: the
    forward runs through wrap(net) (a DDP wrapper)."""
    net = _Layers(seed=41).cuda()
    model = net if wrap is None else wrap(net)
    # Named parameters, no model: every layer's matrix goes to Muon.
    opt = muonps.Muon(list(net.named_parameters()), lr=0.02,
                      weight_decay=0.1, **options)
    assert len(opt._cuda.matrices) == 8
    if forward_waits:
        with pytest.raises(ValueError, match="holds"):
            opt.hook_forward(net.layers[0])
        assert not opt._cuda.forward_hooks
        opt.hook_forward(net)
        assert len(opt._cuda.forward_hooks) == 8 + 1  # + state_dict
    if expandable_after_start:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    g = torch.Generator().manual_seed(43)
    losses = []
    for _ in range(12):
        x = torch.randn(64, 1024, generator=g).cuda()
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    weights = {n: p.detach().clone() for n, p in net.state_dict().items()}
    opt.synchronize()
    torch.cuda.synchronize()
    buffers = opt._cuda.grads
    in_place = all(n not in buffers or
                   p.grad.data_ptr() != buffers[n].data_ptr()
                   for n, p in net.named_parameters())
    dirty = set(opt._cuda.dirty)
    opt.close()
    assert not opt._cuda.forward_hooks
    return ([l.item() for l in losses], weights,
            {"dirty": dirty, "buffers": set(buffers), "in_place": in_place,
             "matrices": {n for n, _ in net.named_parameters()}})


def test_forward_waits_per_layer_give_what_whole_step_waits_give(cluster):
    """The next forward waits per layer (hook_forward) instead of the
    trainer's stream waiting for the whole step: step() returns with the
    stream free, each layer's pre-hook waits on the device for the
    parameters of its own matrix (the worker writes them in the order they
    were lent), and zero_grad waits until the worker read the last step's
    gradients. Trained 12 steps on the same batches from the same start,
    the parameters and losses are bit for bit those of a model whose stream
    waits for each whole step; a forward that read a layer before its
    update landed would part from them at once. A model that does not hold
    every lent matrix is refused, naming one. The model whose stream waits
    for the whole step hands the worker the gradients backward allocated
    (placed: read in place, with no gradient buffer lent or made); the one
    with forward waits adds them into buffers of the optimizer's, placed
    at every step: the two paths agree bit for bit too."""
    waited_losses, waited, placed = _train_layers(
        cluster(workers=1, device="cuda:0").options())
    # No gradient buffer was lent or made: backward's gradients were read.
    assert not placed["buffers"] and placed["in_place"]
    losses, weights, copied = _train_layers(
        cluster(workers=1, device="cuda:0").options(), forward_waits=True)
    assert copied["dirty"] == copied["buffers"] == copied["matrices"]
    assert losses == waited_losses
    assert losses[-1] < losses[0]
    for n in waited:
        assert torch.equal(weights[n], waited[n]), n
    print(f'{{"what":"python_cuda_forward_waits_vs_whole_step","steps":12,'
          f'"first_loss":{losses[0]:.6f},"last_loss":{losses[-1]:.6f},'
          f'"bit_identical":true}}')


def test_gradients_under_ddp_are_read_in_place_as_without_it(
        cluster, tmp_path):
    """Under DDP (one rank here, with its buckets and reduction as on
    many) the reduced gradient lands in each parameter's .grad, a tensor of
    its own or a view into DDP's bucket (gradient_as_bucket_view): the step
    reads it where it lies, and 12 steps give the losses and weights of the
    same model without DDP, bit for bit."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    losses, weights, _ = _train_layers(
        cluster(workers=1, device="cuda:0").options())
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store",
                            rank=0, world_size=1)
    try:
        for view in (False, True):
            got_losses, got, lent = _train_layers(
                cluster(workers=1, device="cuda:0").options(),
                wrap=lambda net: DistributedDataParallel(
                    net, gradient_as_bucket_view=view))
            assert lent["in_place"] and not lent["buffers"], view
            assert got_losses == losses, view
            for n in weights:
                assert torch.equal(got[n], weights[n]), (view, n)
    finally:
        dist.destroy_process_group()


_EXPANDABLE = """
import json, sys, warnings
import torch
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/.."]  # the tests, muonps
from test_cuda import _train_layers
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    losses, weights, lent = _train_layers(json.loads(sys.argv[2]),
                                          expandable_after_start=True)
torch.save({"losses": losses, "weights": weights,
            "dirty": sorted(lent["dirty"]), "lent": sorted(lent["matrices"]),
            "buffers": sorted(lent["buffers"]), "warnings": [str(w.message) for w in caught]}, sys.argv[3])
"""


def test_gradients_in_expandable_segments_are_copied_with_a_warning(
        cluster, tmp_path):
    """Memory of PyTorch's expandable segments has no CUDA IPC handle
    (muonps.Muon cannot lend its buffers from it), so a trainer that turns
    them on after the optimizer started cannot hand the worker the
    gradients backward allocates there: each such matrix warns once,
    naming it, and its gradient is copied at every step into a buffer the
    optimizer makes for it then, of memory the client allocates itself,
    which CUDA can lend (a gradient that lands in a block cached before is
    still read in place). It trains bit for bit as a trainer whose
    gradients are all read in place."""
    losses, weights, placed = _train_layers(
        cluster(workers=1, device="cuda:0").options())
    assert placed["in_place"]
    options = {k: str(v) if isinstance(v, pathlib.PurePath) else v
               for k, v in cluster(workers=1, device="cuda:0")
               .options().items()}
    out = tmp_path / "expandable.pt"
    subprocess.run([sys.executable, "-c", _EXPANDABLE,
                    str(pathlib.Path(__file__).parent), json.dumps(options),
                    str(out)], check=True, timeout=180)
    got = torch.load(out)
    # Those whose gradient landed in an expandable segment (the others in
    # blocks cached before), each warned once.
    assert got["dirty"], got["warnings"]
    warned = [w for w in got["warnings"] if "cannot be read where" in w]
    assert sorted(n for n in got["lent"] if any(repr(n) in w for w in warned)
                  ) == got["dirty"], got["warnings"]
    assert len(warned) == len(got["dirty"]), got["warnings"]
    assert got["buffers"] == got["dirty"]  # made for those alone
    assert got["losses"] == losses
    for n in weights:
        assert torch.equal(got["weights"][n].cpu(), weights[n].cpu()), n
