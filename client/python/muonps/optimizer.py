"""muonps.Muon: a torch.optim.Optimizer whose matrices are stepped by muonps.

The Muon arguments mean exactly what torch.optim.Muon's mean: per matrix,
`buf.lerp_(g, 1 - momentum)`; the update is `g.lerp(buf, momentum)` with
nesterov, else `buf`; it is orthogonalized by `ns_steps` quintic
Newton-Schulz iterations; then `p *= 1 - lr * weight_decay` (the unadjusted
lr) and `p -= adjusted_lr * update` with adjusted_lr = lr * sqrt(max(1,
rows/cols)) ("original") or lr * 0.2 * sqrt(max(rows, cols))
("match_rms_adamw"). The muonps workers run it (a 3-D parameter is a stack
of expert matrices, each its own matrix); every other parameter gets
torch.optim.AdamW's update from one AdamW per trainer kind: the client's
(libmuonps) for parameters on the CPU, torch's fused AdamW for parameters
on a GPU. Param groups are registered once when the job starts; every
step passes each group's lr, weight decay, AdamW lr and AdamW weight decay
by index, and each parameter takes its own group's.

Not thread-safe: one trainer thread uses an optimizer, as with torch's.
"""

import math
import os
import re
import warnings

import torch

from . import _messages, _native, _startup, _state
# Still importable from here, where it lived before muonps/_startup.py.
from ._startup import default_worker_socket  # noqa: F401
from .routing import Router, resolve_model, split_named

DEFAULT_NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
# The client's refusal of a step id it never sent that the workers had
# committed (client/client_step.cc), and the last step it names.
_APPLIED_BEFORE = re.compile(r"had already applied step \d+")
_COMMITTED_THROUGH = re.compile(r"committed through step (\d+)")
DEFAULT_EPS = 1e-7


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon's update, run by a muonps job; AdamW for the rest.

    params: the model (an nn.Module: its named_parameters()), parameters,
        (name, parameter) pairs as `model.named_parameters()` yields, or
        param groups of either. Unnamed ones are "param.{i}".
        Names must be unique; every rank passes the same ones in the same
        order. Parameters with requires_grad=False at start are left alone.
    lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps,
    adjust_lr_fn: torch.optim.Muon's.
    ns_algorithm: "auto" (the workers' plan picks NS5 or Gram NS per shape),
        "ns5" or "gram" (equal in exact arithmetic; see docs/architecture.md).
    adamw_lr: AdamW's lr; None follows each group's "lr" (so schedulers move
        both). A set value is scaled by a scheduler as "lr" is (by
        group["lr"] / group["initial_lr"]).
    adamw_betas, adamw_eps, adamw_weight_decay: torch.optim.AdamW's.
    coordinator: "HOST:PORT" of a running service (default
        $MUONPS_COORDINATOR). With neither, and one rank, the optimizer
        starts a private coordinator and worker as child processes on
        loopback (muonps/_service.py) and stops them on close() or exit.
    job: the job's name (default $MUONPS_JOB or "default"); its workers are
        started with --job JOB.
    worker_socket: this rank's worker (default $MUONPS_WORKER_SOCKET, else
        $XDG_RUNTIME_DIR/muonps/worker-w{LOCAL_RANK or rank}.sock (else
        /tmp/muonps-UID/worker-w{...}.sock), the socket of a
        worker started with --worker_id w{LOCAL_RANK or rank}).
    rank, world_size: default torch.distributed's, else 0 and 1.
    layout: "replicated" (every rank passes the reduced gradient, as after
        DDP) or "unreduced" (each its own; the workers average them).
        Parameters that are DTensors (FSDP2's fully_shard) need no layout:
        their matrices are "row_sharded" as PyTorch sharded them (each rank
        lends its own rows; see muonps/_dtensor.py) and their other tensors
        go to torch.optim.AdamW. On HSDP's 2-D mesh (fully_shard(mesh=2-D
        mesh), placements (Replicate(), Shard(0))) the rows are split over
        the ranks of each replica group, and the job is created with the
        mesh's replica groups.
    is_matrix(name, param) -> bool: which parameters Muon steps. By default
        the model decides (muonps/routing.py): Muon gets the hidden layers'
        2-D weights (3-D: expert stacks); embeddings, weights tied to them,
        the output head, norms, biases and scalars get AdamW. A param
        group's "use_muon" (True/False) overrides both for its parameters.
        The split is logged (logger "muonps", INFO) and in describe().
    model: the nn.Module the parameters belong to, when `params` does not
        say it (muonps.Muon(model) and model.named_parameters() do); without
        one, names and shapes decide (`muonps.default_is_matrix`).
    timeout: seconds to wait for the worker's plan (one holding a worker per
        trainer rank: the first step waits for the other ranks' workers to
        join) and for a step.
    dedicated_workers: workers with no trainer (muonps-worker --dedicated,
        a dedicated optimizer pool) the job waits for; 0 by default.
    allow_momentum_reset: when a worker is lost and a matrix it owned can
        get its momentum neither from it nor from a checkpoint, True starts
        that matrix again from zero momentum (with a warning); False (the
        default) makes the step raise, naming the matrix.
    checkpoint_dir, checkpoint_every: the workers checkpoint the momentum
        they own into checkpoint_dir (a directory every worker reaches)
        after every step whose id is a multiple of checkpoint_every (0: only
        after checkpoint()), and restore momentum they lack from there when
        they start or the plan changes; state_dict(checkpoint=True) then
        references the checkpoint instead of copying momentum.
    qk_clip: a muonps.QKClip (Kimi K2's MuonClip): after each step given
        max_logits, the attention heads whose largest logit exceeded its
        threshold are shrunk (see muonps/qk_clip.py).

    Param groups may set their own "lr", "weight_decay", "adamw_lr" and
    "adamw_weight_decay"; the other hyperparameters are the job's. The
    client starts in the constructor (lazily at the first step if some
    parameter is not materialized yet): parameters then live in buffers
    shared with the local worker (`param.data` is re-pointed there; views of
    the old storage taken before do not follow). `close()` moves them back.
    """

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95,
                 nesterov=True, ns_coefficients=DEFAULT_NS_COEFFICIENTS,
                 eps=DEFAULT_EPS, ns_steps=5, adjust_lr_fn=None, *,
                 ns_algorithm="auto", adamw_lr=None, adamw_betas=(0.9, 0.999),
                 adamw_eps=1e-8, adamw_weight_decay=0.01, coordinator=None,
                 job=None, worker_socket=None, rank=None, world_size=None,
                 layout="replicated", is_matrix=None, timeout=60.0,
                 dedicated_workers=0, qk_clip=None,
                 allow_momentum_reset=False, checkpoint_dir=None,
                 checkpoint_every=0, model=None):
        params, model = resolve_model(params, model)
        _validate(lr, weight_decay, momentum, ns_steps, adamw_lr, adamw_betas,
                  adamw_eps, adamw_weight_decay)
        if adjust_lr_fn not in (None, *_startup.ADJUST_LR):
            raise ValueError(f"adjust_lr_fn: {adjust_lr_fn!r} is not "
                             "'original', 'match_rms_adamw' or None")
        ns_coefficients = tuple(float(v) for v in ns_coefficients)
        if len(ns_coefficients) != 3 or not all(map(math.isfinite,
                                                    ns_coefficients)):
            raise ValueError(f"ns_coefficients: {ns_coefficients!r} is not "
                             "three finite numbers (a, b, c)")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps: {eps!r} must be positive and finite")
        if ns_algorithm not in _startup.NS_ALGORITHMS:
            raise ValueError(f"ns_algorithm: {ns_algorithm!r} is not 'auto', "
                             "'ns5' or 'gram'")
        if layout not in _startup.LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of "
                             f"{sorted(_startup.LAYOUTS)}")
        self._names = {}  # parameter -> name
        self._param_count = 0
        self._client = None
        self._cuda = None  # CudaPath when the parameters are on a GPU
        self._lent = []
        self._frozen = []
        # Names already warned of stepping with no gradient (once each).
        self._gradless = set()
        self._finalizer = None
        self._service = None  # a private LocalService (zero setup)
        self._step_id = 0
        self._failed_step = None  # a step id whose call raised
        # The next step is this optimizer's first (or the first after
        # load_state_dict): the job's workers may have applied its id
        # already, in an earlier run of the job (see _first_step).
        self._first = True
        self._loaded = False  # load_state_dict gave the momentum
        self._router = Router(model, is_matrix)
        self._peers = []  # the other ranks' workers (muonps/_state.py)
        # HSDP's replica groups of the job (muonps/_dtensor.py); 1: none.
        self._replicas = 1
        self._qk_clip = qk_clip
        if coordinator:
            _messages.check_address(coordinator, f"coordinator={coordinator!r}")
        elif os.environ.get("MUONPS_COORDINATOR"):
            _messages.check_address(
                os.environ["MUONPS_COORDINATOR"],
                f"MUONPS_COORDINATOR={os.environ['MUONPS_COORDINATOR']!r}")
        self._connection = {
            # None: a private service, started with the client.
            "coordinator": coordinator or os.environ.get("MUONPS_COORDINATOR"),
            "job": job or os.environ.get("MUONPS_JOB", "default"),
            "worker_socket": worker_socket, "rank": rank,
            "world_size": world_size, "layout": layout, "timeout": timeout,
            "dedicated_workers": int(dedicated_workers),
            "allow_momentum_reset": bool(allow_momentum_reset),
            "checkpoint_dir": checkpoint_dir,
            "checkpoint_every": int(checkpoint_every)}
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum,
            nesterov=nesterov, ns_coefficients=tuple(ns_coefficients), eps=eps,
            ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn, adamw_lr=adamw_lr,
            adamw_betas=tuple(adamw_betas), adamw_eps=adamw_eps,
            adamw_weight_decay=adamw_weight_decay, ns_algorithm=ns_algorithm)
        super().__init__(params, defaults)
        if all(_materialized(p) for g in self.param_groups for p in g["params"]):
            self._start()

    def add_param_group(self, param_group):
        if getattr(self, "_client", None) is not None:
            raise RuntimeError("muonps.Muon: the job's tensors are fixed once "
                               "it started; add param groups before the "
                               "first step")
        group = dict(param_group)
        tensors, names = split_named(group["params"], self._param_count)
        self._param_count += len(tensors)
        self._names.update(zip(tensors, names))
        group["params"] = tensors
        super().add_param_group(group)

    @property
    def job(self):
        return self._connection["job"]

    @property
    def step_id(self):
        """The id the next step() sends (0, 1, 2, ...)."""
        return self._step_id

    @torch.no_grad()
    def step(self, closure=None, *, max_logits=None):
        """One optimizer step on every parameter; returns closure's loss.
        `max_logits` ({query weight name: per-head maximum attention logits
        of this step}) drives qk_clip after the update."""
        loss = self._step(closure)
        if self._qk_clip is not None and max_logits:
            by_name = {n: p for p, n in self._names.items()}
            self._qk_clip.check(by_name)
            self._qk_clip.apply(by_name, max_logits)
        elif max_logits:
            raise ValueError("muonps.Muon: max_logits without qk_clip")
        return loss

    def _warn_gradless(self):
        """Says, once per parameter, that one of the job's parameters has no
        gradient this step: torch.optim.Muon and AdamW leave such a parameter
        and its state alone, while the job steps every parameter with what
        its trainers lend, zeros for none, so its momentum and weight decay
        still move it."""
        frozen = {id(p) for p in self._frozen}
        for p, name in self._names.items():
            if p.grad is not None or id(p) in frozen or name in self._gradless:
                continue
            self._gradless.add(name)
            warnings.warn(
                f"muonps.Muon: {name!r} has no gradient this step; "
                "torch.optim.Muon (or AdamW) would leave it and its state as "
                "they are, while muonps steps it with a zero gradient (its "
                "momentum and weight decay still change it). Give it a "
                "gradient (zeros, if it took no part), or leave it out of "
                "the optimizer, to keep the two equal", stacklevel=4)

    def _step(self, closure):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_open()
        if self._client is None:
            self._start()
        for p in self._frozen:
            if p.grad is not None:
                raise RuntimeError(
                    f"muonps.Muon: {self._names[p]!r} has a gradient but did "
                    "not require one when the job started, so it is not in it")
        self._warn_gradless()
        values = [_group_values(g) for g in self.param_groups]
        if self._cuda is not None:
            try:
                outcome = self._cuda.step(self._step_id, values,
                                          check_first=self._first)
            except _native.MuonpsError as e:
                if (self._first and e.code == _native.FAILED_PRECONDITION
                        and _APPLIED_BEFORE.search(str(e))):
                    raise RuntimeError(self._applied_before_message(
                        cuda=True)) from e
                raise
            if outcome is not None and outcome.already_applied:
                raise RuntimeError(self._applied_before_message(cuda=True))
            self._first = False
            self._step_id += 1
            return loss
        # A retry of a step whose call raised: the lent buffers may hold
        # what the workers committed, which the parameters (DTensor shards)
        # have not been given yet; copying those in again would lose it.
        retrying = self._failed_step == self._step_id
        for t in self._lent:
            if not retrying:
                t.rebind()
            t.load_grad()
        try:
            # Each group's values go to the client by index: the workers
            # apply the Muon lr/wd atomically, the client's AdamW steps the
            # other tensors once per committed step id.
            if self._first and not retrying:
                outcome = self._first_step(values)
            else:
                outcome = self._client.step(self._step_id, values)
        except _native.MuonpsError:
            self._failed_step = self._step_id
            raise
        step_id = self._step_id
        if outcome.already_applied and self._failed_step != step_id:
            raise RuntimeError(self._applied_before_message())
        if outcome.already_applied:
            warnings.warn(f"muonps: step {step_id} was committed by an earlier "
                          "attempt that raised; it was not applied again")
        if outcome.momentum_reset:
            warnings.warn(f"muonps: {outcome.momentum_reset} matrices of this "
                          f"rank's worker started step {step_id} from zero "
                          "momentum: their previous owner left the job (or "
                          "restarted) and no checkpoint held their momentum "
                          "(allow_momentum_reset=True)")
        for t in self._lent:
            t.store()
        self._failed_step = None
        self._first = False
        self._step_id += 1
        return loss

    def _first_step(self, values):
        """The first step of this optimizer (or the first after
        load_state_dict), on the CPU path; returns its StepOutcome.

        Its id may have been applied by the job's workers in an earlier run
        of the same job (the same script run again against a running
        service). The workers then apply nothing (the client refuses the
        step, naming the last one committed, or answers already_applied),
        and this run goes on as a new one: unless a state was loaded, the
        momentum of the job's matrices restarts from zero (as a fresh torch
        optimizer's), and the step goes to the first id the workers have not
        applied (ids only need to increase). The client's AdamW part is held
        until the workers say which id they ran, then run once for it (the
        client runs it for a committed id it has not stepped).
        """
        client = self._client
        first = self._step_id
        try:
            outcome, last = self._try_step(first, values, reload=False)
            if outcome is None:
                if not self._loaded:
                    self._reset_momentum(first)
                gap = 1
                while outcome is None:
                    self._step_id = max(first + gap, -1 if last is None
                                        else last + 1)
                    gap *= 2
                    outcome, last = self._try_step(self._step_id, values)
                warnings.warn(self._new_run_message(first))
        finally:
            client.set_last_adamw_step(self._step_id - 1)
        # The committed step's AdamW part: the worker answers the same id
        # already_applied (it is committed), and the client steps AdamW.
        client.step(self._step_id, values)
        return outcome

    def _try_step(self, step_id, values, reload=True):
        """(outcome, None) when the workers ran `step_id` now; (None, the
        last step they committed, or None if not said) when they had
        applied it before. AdamW is held (see _first_step)."""
        if reload:
            # An already applied id may give that step's averaged gradients
            # back to the lent buffers (unreduced layout): this step's own
            # go in again.
            for t in self._lent:
                t.load_grad()
        self._client.set_last_adamw_step(step_id)
        try:
            outcome = self._client.step(step_id, values)
        except _native.MuonpsError as e:
            refused = _APPLIED_BEFORE.search(str(e))
            if e.code != _native.FAILED_PRECONDITION or refused is None:
                raise
            last = _COMMITTED_THROUGH.search(str(e))
            return None, int(last[1]) if last else None
        if outcome.already_applied:
            return None, None
        return outcome, None

    def _reset_momentum(self, first):
        """Zero momentum for every matrix this rank's worker owns (every
        matrix, over all ranks, when the job has no dedicated workers)."""
        if self._connection["dedicated_workers"]:
            raise RuntimeError(self._applied_before_message(
                why="an earlier run of this job stepped it, and its "
                f"{self._connection['dedicated_workers']} dedicated worker(s) "
                "hold momentum of that run, which this optimizer cannot "
                "reset to start a new one", step_id=first))
        zeros = {}
        for t in self._lent:
            if not t.muon:
                continue
            shape = tuple(t.shape[-2:])
            if shape not in zeros:
                zeros[shape] = torch.zeros(shape, dtype=torch.float32)
            for expert in range(t.experts):
                self._client.set_momentum(t.name, expert, zeros[shape])

    def _new_run_message(self, first):
        if self._loaded:
            return (f"muonps: the workers of job {self.job!r} had already "
                    f"applied step {first}, the loaded state's next step (a "
                    "later part of this run, or another run of the job): the "
                    "run goes on from the loaded state, with step ids from "
                    f"{self._step_id}")
        return (f"muonps: the workers of job {self.job!r} had already applied "
                f"step {first} (an earlier run of this job): this optimizer "
                "starts a new run, with the momentum of the job's matrices "
                f"reset to zero and step ids from {self._step_id}. To go on "
                "with the earlier run instead, load its state_dict() before "
                "the first step")

    def _applied_before_message(self, cuda=False, why=None, step_id=None):
        """Why step `step_id` (default: the next) cannot run, and what to
        do: `why` follows "had already applied step N: "."""
        step_id = self._step_id if step_id is None else step_id
        if why is None and cuda:
            why = ("an earlier run of this job stepped it, and a GPU trainer "
                   "cannot start a new run on such a job (this process's "
                   "CUDA stream now waits for a step that will not come: end "
                   "the process)")
        elif why is None:
            why = "another optimizer stepped this job further meanwhile"
        return (f"muonps.Muon: the workers of job {self.job!r} (this rank's "
                f"at unix:{self._socket}) had already applied step {step_id}"
                f": {why}. Give each run its own job (start its workers with "
                "--job NAME and pass job='NAME'; or leave out coordinator= "
                "and muonps.Muon starts a private service), or resume with "
                "load_state_dict() of the run's latest state")

    def describe(self):
        """How the parameters were split between Muon and AdamW: counts of
        tensors and parameters, and the embeddings, heads and tied weights
        on AdamW (the line logged when the job started)."""
        if self._client is None and not self._router.decisions:
            return "muonps routing: not decided yet (the job starts at the " \
                   "first step)"
        return self._router.describe()

    def synchronize(self):
        """GPU parameters: waits for the last step (step() returns once it
        is enqueued) and raises its error, if it failed (the parameters are
        then as before it). A no-op on the CPU path, whose steps finish
        before step() returns."""
        if self._cuda is not None:
            self._cuda.wait()

    def hook_forward(self, module):
        """GPU parameters: the next forward of `module` (the model, or its
        DDP wrapper) waits per layer for the step's updates, not for the
        whole step: step() returns with the trainer's stream free, and each
        submodule that holds job matrices waits, on the device, for their
        parameters before its forward (see muonps/_cuda.py's
        CudaPath.hook_forward: a job matrix no submodule holds raises
        ValueError; a parameter read outside its module's forward is read
        after synchronize()). A no-op on the CPU path, whose steps finish
        before step() returns."""
        self._check_open()
        if self._client is None:
            self._start()
        if self._cuda is not None:
            self._cuda.hook_forward(module)

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)
        if self._cuda is not None:
            self._cuda.zero_grad(set_to_none)

    def checkpoint(self):
        """Asks this rank's worker to checkpoint the momentum it owns into
        checkpoint_dir right after the next step it commits (call it on
        every rank); returns the last step it checkpointed (-1: none)."""
        self._check_open()
        if self._client is None:
            self._start()
        return self._client.checkpoint()

    def state_dict(self, checkpoint=False):
        """The whole optimizer's state, on any rank: torch's state dict
        whose per-parameter "state" holds what torch.optim.Muon and AdamW
        keep ("momentum_buffer"; "exp_avg", "exp_avg_sq", "step") plus
        "muonps_step", and "muonps": the next step id, AdamW moments and
        step count, and the momentum of every matrix keyed "name[expert]",
        read from whichever worker owns it (the other ranks' workers on
        this host are read through their sockets; they need not call
        anything). So rank 0's state restores every rank.

        A matrix owned by another host's worker is referenced instead in
        the workers' checkpoint of the last step, when the job has
        checkpoint_dir and that step was checkpointed; otherwise this
        raises, naming it. With checkpoint=True all momentum stays on disk:
        "checkpoint" names the workers' checkpoint of the last step in
        checkpoint_dir (which checkpoint_every or checkpoint() must have
        asked for), and "momentum" is empty."""
        self._check_open()
        if self._client is None:
            self._start()
        state = super().state_dict()
        saved, per_param = _state.saved_state(self, checkpoint)
        state["muonps"] = saved
        index, packed = 0, {}
        lent = {t.name for t in self._lent} | (
            {n for n, _, _ in self._cuda.matrices + self._cuda.others}
            if self._cuda is not None else set())
        for group in self.param_groups:
            for p in group["params"]:
                name = self._names[p]
                if name in lent:
                    entry = dict(per_param.get(name, {}))
                    entry["muonps_step"] = self._step_id
                    if "checkpoint" in saved:
                        entry["muonps_checkpoint_dir"] = \
                            saved["checkpoint"]["dir"]
                        entry["muonps_checkpoint_step"] = \
                            saved["checkpoint"]["step"]
                    packed[index] = entry
                index += 1
        state["state"] = packed
        return state

    def load_state_dict(self, state_dict, allow_momentum_reset=None):
        """Restores groups, the step id, AdamW state and momentum from
        state_dict() of any rank (or from what
        torch.distributed.checkpoint's get_optimizer_state_dict kept of
        it): each rank's worker takes the matrices it owns; a state that
        references a checkpoint makes the workers restore them from it.

        A state that lacks some matrices' momentum (one rank's state from a
        muonps before 0.2, or another model's) raises ValueError naming
        them, unless allow_momentum_reset (default: the constructor's) is
        True: those matrices then start from zero momentum."""
        self._check_open()
        state_dict = dict(state_dict)
        saved = state_dict.pop("muonps", None)
        per_param = state_dict.get("state", {})
        super().load_state_dict({"state": {},
                                 "param_groups": state_dict["param_groups"]})
        if self._client is None:
            self._start()
        else:
            for group in self.param_groups:  # see _startup.start
                for p in group["params"]:
                    self.state[p] = {}
        if saved is None:
            saved = _state.from_per_param(self, per_param)
            if saved is None:
                return
        allow = (self._connection["allow_momentum_reset"]
                 if allow_momentum_reset is None else allow_momentum_reset)
        reset = _state.check_complete(self, saved, allow)
        _state.restore_state(self, saved, reset)
        # The loaded step id may be behind the workers' (see _first_step).
        self._loaded = True
        self._first = True

    def close(self):
        """Moves the parameters back to their own memory and releases the
        client (and its shared memory). The optimizer cannot step after."""
        _state.close_peers(self)
        if self._finalizer is not None:
            self._finalizer()

    def _check_open(self):
        if self._finalizer is not None and not self._finalizer.alive:
            raise RuntimeError("muonps.Muon: the optimizer was closed")

    def _start(self):
        """Starts the job and the client (see muonps/_startup.py)."""
        _startup.start(self)


def _group_values(group):
    """What a step passes for a param group: (lr, weight_decay, adamw_lr,
    adamw_weight_decay)."""
    return (group["lr"], group["weight_decay"], _adamw_lr(group),
            group["adamw_weight_decay"])


def _adamw_lr(group):
    """A group's AdamW lr: its "adamw_lr" (scaled as "lr" by schedulers) or,
    when unset, its "lr"."""
    lr = group["adamw_lr"]
    if lr is None:
        return group["lr"]
    if group.get("initial_lr"):
        return lr * group["lr"] / group["initial_lr"]
    return lr


def _materialized(p):
    return not (p.is_meta or isinstance(p, torch.nn.parameter.UninitializedParameter))


def _validate(lr, weight_decay, momentum, ns_steps, adamw_lr, betas, eps,
              adamw_weight_decay):
    checks = [("lr", lr, lr >= 0), ("weight_decay", weight_decay,
                                    weight_decay >= 0),
              ("momentum", momentum, 0 <= momentum < 1),
              ("ns_steps", ns_steps, isinstance(ns_steps, int) and 1 <= ns_steps <= 100),
              ("adamw_lr", adamw_lr, adamw_lr is None or adamw_lr >= 0),
              ("adamw_betas", betas, len(betas) == 2 and all(0 <= b < 1 for b in betas)),
              ("adamw_eps", eps, eps >= 0),
              ("adamw_weight_decay", adamw_weight_decay, adamw_weight_decay >= 0)]
    for name, value, ok in checks:
        if not ok:
            raise ValueError(f"Invalid {name}: {value}")
