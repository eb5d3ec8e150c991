"""The optimizers bench/train_step times, by name: a registry of factories.

A factory takes the model (as the training loop steps it: wrapped in DDP or
fully_shard-ed where it runs so) and a `Context`, and returns a `Stepper`,
which holds one or more torch optimizers and steps them as one. To time
another optimizer on the same model, register a factory:

    @register("lion")
    def _lion(model, ctx):
        return Stepper([Lion(ctx.unwrapped.parameters(), lr=1e-4)])

and pass `--optimizers adamw,lion`. A factory raises `Unavailable` when the
optimizer cannot run here (this torch lacks it, one GPU only): the loop
prints a line saying why and goes on.
"""

import dataclasses

import torch

from llama_model import is_hidden_matrix

FACTORIES = {}


class Unavailable(Exception):
    """This optimizer does not run in this setting; the message says why."""


def register(name):
    def add(factory):
        if name in FACTORIES:
            raise ValueError(f"optimizer {name!r} is registered twice")
        FACTORIES[name] = factory
        return factory
    return add


@dataclasses.dataclass
class Context:
    """What a factory may need: the flags, where it runs, and the model
    under its wrappers."""
    args: object
    device: torch.device
    rank: int
    world: int
    parallel: str  # "none", "ddp" or "fsdp"
    unwrapped: torch.nn.Module  # the model inside DDP's wrapper


class Stepper:
    """Optimizers stepped one after another as one iteration's step.

    `synchronize`: waits for an asynchronous step and raises its error
    (muonps.Muon's), or None. `notes`: what the output line should say
    about how this optimizer was set up and timed. `split`: which
    parameters went to which part (counts)."""

    def __init__(self, optimizers, notes=None, synchronize=None, split=None,
                 close=None):
        self.optimizers = list(optimizers)
        self.notes = notes or {}
        self.synchronize = synchronize
        self.split = split or {}
        self._close = close

    def zero_grad(self):
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)

    def step(self):
        for o in self.optimizers:
            o.step()

    def close(self):
        if self._close is not None:
            self._close()


def adamw(params, ctx):
    """torch.optim.AdamW, fused on CUDA (foreach over DTensors, which the
    fused kernel does not take in every torch); returns (optimizer,
    implementation)."""
    a = ctx.args
    params = list(params)
    kwargs = dict(lr=a.adamw_lr, betas=(0.9, 0.95),
                  weight_decay=a.adamw_weight_decay)
    dtensors = any(type(p).__name__ == "DTensor" for p in params)
    if ctx.device.type == "cuda" and not dtensors:
        return torch.optim.AdamW(params, fused=True, **kwargs), "fused"
    try:
        return torch.optim.AdamW(params, foreach=True, **kwargs), "foreach"
    except TypeError:  # a torch without foreach=
        return torch.optim.AdamW(params, **kwargs), "default"


def hidden_split(ctx):
    """(hidden matrices, every other parameter) of the model."""
    matrices, others = [], []
    for name, p in ctx.unwrapped.named_parameters():
        (matrices if is_hidden_matrix(name, p) else others).append(p)
    return matrices, others


def split_counts(matrices, others):
    return {"muon_tensors": len(matrices),
            "muon_params": sum(p.numel() for p in matrices),
            "adamw_tensors": len(others),
            "adamw_params": sum(p.numel() for p in others)}


@register("adamw")
def _adamw(model, ctx):
    opt, kind = adamw(ctx.unwrapped.parameters(), ctx)
    params = list(ctx.unwrapped.parameters())
    return Stepper([opt], notes={"adamw": kind},
                   split={"adamw_tensors": len(params),
                          "adamw_params": sum(p.numel() for p in params)})


class _KeptGrads(Stepper):
    def zero_grad(self):
        for o in self.optimizers:
            o.zero_grad(set_to_none=False)


@register("adamw_kept_grads")
def _adamw_kept_grads(model, ctx):
    """Fused AdamW whose zero_grad zeroes the gradients in place rather
    than dropping them, as muonps.Muon must for the gradients it lends its
    worker: backward then adds into them instead of handing its results
    over. Times that cost apart from any optimizer's."""
    opt, kind = adamw(ctx.unwrapped.parameters(), ctx)
    params = list(ctx.unwrapped.parameters())
    return _KeptGrads([opt], notes={"adamw": kind, "zero_grad": "in place"},
                      split={"adamw_tensors": len(params),
                             "adamw_params": sum(p.numel() for p in params)})


def muon_kwargs(args):
    return dict(lr=args.muon_lr, weight_decay=args.muon_weight_decay,
                momentum=0.95, nesterov=True)


@register("torch_muon")
def _torch_muon(model, ctx):
    """torch.optim.Muon on the hidden matrices, AdamW on the rest, as
    torch's documentation recommends. Under DDP or FSDP2 every rank runs
    it on what it holds (the whole matrices under DDP)."""
    if not hasattr(torch.optim, "Muon"):
        raise Unavailable(f"torch {torch.__version__} has no torch.optim.Muon")
    matrices, others = hidden_split(ctx)
    rest, kind = adamw(others, ctx)
    return Stepper([torch.optim.Muon(matrices, **muon_kwargs(ctx.args)), rest],
                   notes={"adamw": kind},
                   split=split_counts(matrices, others))


def owners_by_size(sizes, world):
    """Owner rank of each matrix: largest first, dealt to the ranks in turn
    (bench/ns_gpu/torch_step_peers.py's rule)."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    owner = [0] * len(sizes)
    for k, i in enumerate(order):
        owner[i] = k % world
    return owner


class OwnerMuon:
    """torch.optim.Muon on the matrices this rank owns, then every matrix
    broadcast from its owner: the owner-based torch peer under DDP (whose
    all-reduce gave every rank the same gradients)."""

    def __init__(self, matrices, world, rank, kwargs):
        self.matrices = matrices
        self.owner = owners_by_size([p.numel() for p in matrices], world)
        owned = [p for p, o in zip(matrices, self.owner) if o == rank]
        self.muon = torch.optim.Muon(owned, **kwargs) if owned else None

    def zero_grad(self, set_to_none=True):
        if self.muon is not None:
            self.muon.zero_grad(set_to_none=set_to_none)
        for p in self.matrices:  # the ones another rank owns too
            p.grad = None

    @torch.no_grad()
    def step(self):
        import torch.distributed as dist
        if self.muon is not None:
            self.muon.step()
        handles = [dist.broadcast(p.data, src=o, async_op=True)
                   for p, o in zip(self.matrices, self.owner)]
        for h in handles:
            h.wait()


@register("torch_owner_muon")
def _torch_owner_muon(model, ctx):
    if not hasattr(torch.optim, "Muon"):
        raise Unavailable(f"torch {torch.__version__} has no torch.optim.Muon")
    if ctx.world == 1:
        raise Unavailable("on one GPU the owner-based Muon is torch_muon")
    if ctx.parallel != "ddp":
        raise Unavailable("the owner-based Muon needs whole matrices on every "
                          "rank (--parallel ddp)")
    matrices, others = hidden_split(ctx)
    rest, kind = adamw(others, ctx)
    owner = OwnerMuon(matrices, ctx.world, ctx.rank, muon_kwargs(ctx.args))
    return Stepper([owner, rest], notes={"adamw": kind,
                                         "owner_rule": "largest first, "
                                         "round-robin"},
                   split=split_counts(matrices, others))


@register("muonps")
def _muonps(model, ctx):
    """muonps.Muon given the model, so its routing decides what goes to
    Muon (the workers) and what to AdamW. No coordinator named: it starts
    its own coordinator and a worker on this rank's device (zero setup;
    under torchrun rank 0 the coordinator, every rank its worker)."""
    import muonps
    import muonps.ddp
    a = ctx.args
    layout = "replicated"
    if ctx.parallel == "ddp" and a.muonps_layout == "unreduced":
        model.register_comm_hook(None, muonps.ddp.skip_allreduce_hook)
        layout = "unreduced"
    elif ctx.parallel == "fsdp":
        layout = "row_sharded (FSDP2 DTensors)"
    kwargs = dict(lr=a.muon_lr, weight_decay=a.muon_weight_decay,
                  momentum=0.95, nesterov=True, adamw_lr=a.adamw_lr,
                  adamw_betas=(0.9, 0.95),
                  adamw_weight_decay=a.adamw_weight_decay,
                  timeout=a.muonps_timeout)
    if ctx.parallel == "ddp":
        kwargs["layout"] = layout
    opt = muonps.Muon(ctx.unwrapped, **kwargs)
    # What its router decided (the same split describe() logs).
    decisions = getattr(getattr(opt, "_router", None), "decisions", [])
    matrices = [p for _, p, muon, _ in decisions if muon]
    others = [p for _, p, muon, _ in decisions if not muon]
    cuda = ctx.device.type == "cuda"
    notes = {"layout": layout, "routing": opt.describe(),
             "ns_algorithm": "auto (the plan picks NS5 or Gram NS per shape)",
             "step_returns": ("once enqueued (the trainer's stream waits on "
                              "the device for the worker's update)" if cuda
                              else "once the step is done (CPU path)")}
    if cuda:
        notes["gradients"] = ("allocated by backward; the worker reads them "
                              "where they lie")
    return Stepper([opt], notes=notes, synchronize=opt.synchronize,
                   split=split_counts(matrices, others), close=opt.close)


@register("muonps_step_after_sync")
def _muonps_step_after_sync(model, ctx):
    """muonps.Muon whose step() is called only once the device has run
    backward (torch.cuda.synchronize() first), so the worker's wait for
    the trainer's gradients is never pending while backward runs: beside
    "muonps", what such a pending wait costs backward."""
    stepper = _muonps(model, ctx)
    opt = stepper.optimizers[0]
    step = opt.step

    def synced_step(*args, **kwargs):
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        return step(*args, **kwargs)

    opt.step = synced_step
    stepper.notes["step_called"] = "after torch.cuda.synchronize()"
    return stepper


@register("muonps_backward_hooks")
def _muonps_backward_hooks(model, ctx):
    """muonps.Muon whose gradients are handed to the workers as backward
    finishes each one (CudaPath.hook_gradients, from its second step on:
    the client starts in the first), beside "muonps" in the same run, where
    every gradient reaches the worker through the step's own event."""
    stepper = _muonps(model, ctx)
    opt = stepper.optimizers[0]
    first_step = opt.step

    def step(*args, **kwargs):
        out = first_step(*args, **kwargs)
        cuda = getattr(opt, "_cuda", None)
        if cuda is not None and not cuda.hooks:
            cuda.hook_gradients()
        return out

    opt.step = step
    stepper.notes["gradients"] = ("each matrix's as backward finishes it "
                                  "(post-accumulate-grad hooks)")
    return stepper


@register("muonps_kept_grads")
def _muonps_kept_grads(model, ctx):
    """muonps.Muon whose zero_grad keeps the gradients in place
    (set_to_none=False), so backward adds into the same buffers each
    iteration and the worker reads them there, beside "muonps" in the same
    run, whose gradients backward allocates anew (as adamw_kept_grads is
    to adamw)."""
    stepper = _muonps(model, ctx)
    kept = _KeptGrads(stepper.optimizers, notes=stepper.notes,
                      synchronize=stepper.synchronize, split=stepper.split,
                      close=stepper._close)
    kept.notes["gradients"] = ("zeroed in place; backward adds into them, "
                               "and the worker reads them there")
    return kept


@register("muonps_forward_waits")
def _muonps_forward_waits(model, ctx):
    """muonps.Muon whose next forward waits per layer for the step's
    updates (Muon.hook_forward on the model) instead of the trainer's
    stream waiting for the whole step, beside "muonps" in the same run."""
    stepper = _muonps(model, ctx)
    opt = stepper.optimizers[0]
    if ctx.device.type == "cuda":
        opt.hook_forward(ctx.unwrapped)
        stepper.notes["step_returns"] = (
            "once enqueued; each layer's forward waits on the device for "
            "its own parameters (forward pre-hooks)")
    return stepper
