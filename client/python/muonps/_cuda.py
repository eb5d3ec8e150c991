"""The GPU path of muonps.Muon: CUDA parameters stay where they are.

Matrices are lent to the muonps-worker on the same GPU by CUDA IPC: the
parameter's own storage (updated in place by the worker), fp32 or bf16
(the worker keeps fp32 momentum and rounds each bf16 update once), and no
gradient buffer. Each step hands the worker the gradient backward
allocated, which it reads where it lies (Client::PlaceGradient): no copy,
and zero_grad sets it to None as torch's optimizers do. That is safe because
the trainer's stream waits for the whole step before anything reuses or
writes that memory. Under hook_forward (the stream no longer waits for the
whole step), for no gradient (zeros), or for a gradient of another layout,
the step places a buffer of the optimizer's own instead, made when first
needed (backward adds into it in place under hook_forward; one that lands
elsewhere is copied in at the step). Unreduced AdamW tensors lend a
gradient buffer. The
trainer's current stream records an event the worker's stream waits on and
then waits, on the device, for the worker's updates, so `step()` returns
once the step is enqueued. hook_gradients() adds a post-accumulate-grad
hook (torch >= 2.1) that records each matrix's own event as backward
finishes its gradient, so the step's transfers and Newton-Schulz start
during backward (a gradient written again after its hook, clipped or
unscaled in place, is handed over again at the step; so is a replicated
gradient under DDP, whose reduced value DDP writes back at the end of
backward: layout "unreduced", where the workers reduce, keeps the overlap).
It is not on by default: on 2 x H200 the worker's Newton-Schulz beside
backward slowed backward by as much as it took off the step
(bench/train_step's muonps_backward_hooks). hook_forward(model) makes the
next forward wait per layer instead of per step: the trainer's stream no
longer waits for the step's updates after step(); each module's forward
pre-hook waits, on the device, until the worker has written the
parameters of the matrices it holds (the worker writes them in the order
the matrices were lent, and advances a progress word as they land), so the
first layers run while the last updates are still being written. Param groups are registered when the client
starts and each step carries every group's lr and weight decay by index
(no passes over the parameters in Python). Every other tensor is stepped
by torch's own fused AdamW on the trainer's stream, the one AdamW of a
CUDA trainer (the client steps none of its tensors). A DTensor
(FSDP2) lends its local shard in place; its gradient, a DTensor FSDP2
reduce-scatters anew each step, is read in its local shard, where it lies
(see muonps/_dtensor.py). Not thread-safe (the optimizer's thread only;
the gradient hooks run on autograd's thread, during backward).
"""

import warnings

import torch

from ._abi import MuonpsError
from ._dtensor import TorchAdamW, is_dtensor, local

# What the worker takes: fp32 momentum either way; a bf16 parameter gets
# each update rounded once.
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _first_pre_hook(module, hook):
    # Before the module's other forward pre-hooks (FSDP2's gathers among
    # them) where torch can (2.0 and later).
    try:
        return module.register_forward_pre_hook(hook, prepend=True)
    except TypeError:
        return module.register_forward_pre_hook(hook)


def _mark(grad):
    # What a gradient hook's mark stands for: this tensor as written so far.
    return grad.data_ptr(), grad._version


class _Interface:
    # Device memory as a CUDA array (__cuda_array_interface__, version 3),
    # which keeps it: a tensor made over it holds this object.
    def __init__(self, memory, nbytes):
        self.memory = memory
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "version": 3,
            "data": (memory.ptr, False), "stream": None}


def _over(memory, like):
    # A contiguous tensor of `like`'s shape and dtype over `memory` (zeros,
    # as allocated), which lives as long as the tensor or a view of it.
    nbytes = like.numel() * like.element_size()
    raw = torch.as_tensor(_Interface(memory, nbytes), device=like.device)
    return raw.view(like.dtype).view(like.shape)


def _placeable(grad, buffer):
    # A gradient the worker can read in place of its lent buffer: the same
    # values, layout and device, in memory CUDA can lend.
    return (grad.device == buffer.device and grad.dtype == buffer.dtype and
            grad.shape == buffer.shape and grad.is_contiguous() and
            grad.storage_offset() * grad.element_size() % 4 == 0)


def _queue_callback(callback):
    # Runs `callback` on autograd's thread once the current backward's graph
    # is done (callbacks queued by a callback run after the ones before).
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class CudaPath:
    """One optimizer's lent matrices and its AdamW for the other tensors."""

    def __init__(self, client, device, matrices, others, param_groups,
                 defaults, average_others=False):
        """`matrices` and `others`: (name, param, group index) triples.
        `average_others` (layout "unreduced"): the other tensors' gradients
        are lent too, and the workers average them over the trainers before
        this rank's AdamW (as DDP's all-reduce would have)."""
        self.client = client
        self.device = device
        self.matrices = matrices
        self.others = list(others)
        self.lent = list(matrices) + (list(others) if average_others else [])
        # Matrices that lend no gradient buffer: every step places the
        # gradient, read where backward left it, or (under forward waits, for
        # no gradient, or for one CUDA cannot lend: `copied`) a spare buffer
        # of the optimizer's, made when first needed. The others (unreduced
        # AdamW tensors) lend one. `grads` holds both kinds;
        # `dirty` names those written since they were zeroed.
        self.placeable = {name for name, _, _ in matrices}
        self.copied = set()
        self.dirty = set()
        self.grads = {}
        for name, p, _ in self.lent:
            shard = local(p)
            if not shard.is_contiguous():
                raise TypeError(f"muonps.Muon: {name!r} is not contiguous; "
                                "the worker updates it in place")
            if name in self.placeable:
                client.lend_cuda(name, None, shard, _DTYPES[p.dtype])
                continue
            buffer = torch.zeros_like(shard,
                                      memory_format=torch.contiguous_format)
            self.grads[name] = buffer
            if p.grad is not None:
                buffer.copy_(local(p.grad))
                self.dirty.add(name)
            if not is_dtensor(p):
                p.grad = buffer
            client.lend_cuda(name, buffer, shard, _DTYPES[p.dtype])
        self.data_ptrs = {name: local(p).data_ptr() for name, p, _ in self.lent}
        self.params = {name: p for name, p, _ in self.lent}
        # Matrices a gradient hook marked ready since the last step, with
        # their gradient's (data_ptr, version) then; and the hooks' handles.
        self.ready = {}
        self.hooks = []
        # hook_forward: the modules' pre-hooks wait for the parameters; the
        # highest matrix count waited for since the last step (-1: none).
        self.forward_hooks = []
        self.forward_waits = False
        self.waited = -1
        # Unreduced: the workers average every gradient, the AdamW
        # tensors' too (the means AdamW then reads). Each rank lends its own
        # gradient, so what DDP writes back into it at the end of backward
        # (muonps.ddp's hook returns the bucket unchanged) is the value
        # marked, and the versions are taken once backward is done
        # (_settle). Replicated: that write is DDP's reduced gradient, which
        # the step marks again.
        self.workers_average = average_others
        self.settling = False
        for index in range(len(param_groups)):
            client.set_group(index, [n for n, _, g in self.lent if g == index])
        self.adamw = None
        if others:
            self.adamw = TorchAdamW(
                others, param_groups, defaults,
                fused=not any(is_dtensor(p) for _, p, _ in others))

    def hook_gradients(self):
        """Once the client started (the bench's muonps_backward_hooks and
        the tests call it): a post-accumulate-grad hook per lent
        matrix marks its gradient ready (client.gradient_ready) on the
        stream backward accumulated it on, when that gradient is the one
        the step reads. A DTensor's gradient (FSDP2 reduce-scatters a new
        one after backward) and a gradient copied into a spare buffer at
        the step are ordered by the step's stream. Without the hook (torch < 2.1) the step's
        stream orders every gradient, as for a trainer that never marks. A
        worker outside CUDA MPS leaves the marks unused and takes every
        gradient at the step (the two processes would time-slice the GPU).
        close() removes the hooks."""
        if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            return
        for name, p, _ in self.matrices:
            if is_dtensor(p):
                continue
            self.hooks.append(p.register_post_accumulate_grad_hook(
                self._ready_hook(name)))

    def _ready_hook(self, name):
        # Runs on autograd's thread, with the accumulation's stream current.
        client, device, ready = self.client, self.device, self.ready

        def hook(p):
            spare = self.grads.get(name)
            if p.grad is None or not (
                    self._places(name) or
                    (spare is not None and
                     p.grad.data_ptr() == spare.data_ptr())):
                return
            client.gradient_ready(
                name, torch.cuda.current_stream(device).cuda_stream)
            ready[name] = _mark(p.grad)
            if self.workers_average and not self.settling:
                self.settling = True
                _queue_callback(self._after_backward)

        return hook

    def hook_forward(self, module):
        """Makes the next forward of `module` (the model, or the DDP
        wrapper of it) wait per layer for the step's updates instead of the
        whole step after step(): each submodule holding lent matrices gets
        a forward pre-hook that makes the current stream wait, on the
        device, until the parameters of every matrix lent up to its own are
        written (module.state_dict() waits for all of them). A lent matrix
        no submodule holds raises ValueError naming it (nothing would order
        its reads). A parameter read outside its module's forward (an
        evaluation of it, an EMA) reads it after synchronize(). With DTensor
        matrices (FSDP2 gathers the shards of the next layers ahead of
        them) the model's own pre-hook waits for the whole step. Not for a
        module under torch.compile (the hooks call into the client).
        close() removes the hooks."""
        position = {id(p): i for i, (_, p, _) in enumerate(self.matrices)}
        hooks, held = [], set()
        if any(is_dtensor(p) for _, p, _ in self.matrices):
            held = set(position)
            hooks.append(_first_pre_hook(module, self._wait_hook(-1)))
        else:
            for m in module.modules():
                through = 0
                for p in m._parameters.values():
                    if p is not None and id(p) in position:
                        through = max(through, position[id(p)] + 1)
                        held.add(id(p))
                if through:
                    hooks.append(_first_pre_hook(m, self._wait_hook(through)))
        missing = [n for n, p, _ in self.matrices if id(p) not in held]
        if missing:
            for handle in hooks:
                handle.remove()
            raise ValueError(
                f"muonps.Muon.hook_forward: no module of "
                f"{type(module).__name__} holds {missing[:3]!r}"
                f"{' and more' if len(missing) > 3 else ''}: its forward "
                "would not wait for their updates")
        if hasattr(module, "register_state_dict_pre_hook"):
            hooks.append(module.register_state_dict_pre_hook(
                lambda *args, **kwargs: self.wait_for_parameters(-1)))
        self.forward_hooks.extend(hooks)
        self.forward_waits = True

    def _wait_hook(self, through):
        def hook(module, args):
            self.wait_for_parameters(through)
        return hook

    def wait_for_parameters(self, through):
        """The current stream waits until the last step has written the
        parameters of the first `through` lent matrices (-1: all; 0: the
        lent gradients may be written and the AdamW means are in place)."""
        if through == -1 or through > self.waited:
            self.client.wait_for_parameters(
                torch.cuda.current_stream(self.device).cuda_stream, through)
            self.waited = len(self.matrices) + 1 if through == -1 else through

    def _after_backward(self):
        # Queued again, so it runs after every callback queued during
        # backward: DDP's copy of its buckets into the gradients.
        _queue_callback(self._settle)

    def _settle(self):
        # The gradients and versions backward left: a write after this
        # (clipping, unscaling) marks the gradient again at the step.
        for name in self.ready:
            grad = self.params[name].grad
            self.ready[name] = None if grad is None else _mark(local(grad))
        self.settling = False

    def _place(self, name, grad):
        # Hands `grad` over where it lies; False (a warning, once) where CUDA
        # cannot lend its memory: PyTorch's expandable segments (or a
        # stream-ordered pool) have no IPC handle. The step then copies it
        # into the spare buffer, as every later step does for it.
        try:
            self.client.place_gradient(name, grad)
            return True
        except MuonpsError as e:
            self.copied.add(name)
            warnings.warn(f"muonps: {name!r}'s gradient cannot be read where "
                          f"it lies ({e}); it is copied into a buffer of its "
                          "own at every step instead (expandable_segments:"
                          "False in PYTORCH_CUDA_ALLOC_CONF avoids the copy)")
            return False

    def _places(self, name):
        # Whether the step hands this matrix's gradient over where backward
        # left it (the trainer's stream then waits for the whole step, so
        # the memory is neither freed for reuse nor written before the
        # worker read it).
        return (name in self.placeable and name not in self.copied and
                not self.forward_waits)

    def _spare(self, name):
        # A placed matrix's own buffer, zeros, made the first time a step
        # needs one and kept (the worker may read it until the step is
        # done). Its memory is the client's (cudaMalloc), not PyTorch's
        # allocator's, so CUDA can lend it even where expandable segments
        # were turned on after the start.
        buffer = self.grads.get(name)
        if buffer is None:
            buffer = _over(self.client.allocate_gradient(name),
                           local(self.params[name]))
            self.grads[name] = buffer
        return buffer

    def _buffer(self, name):
        # Where a step reads this tensor's gradient when not where backward
        # left it: a matrix's spare buffer, an AdamW tensor's lent one.
        return (self._spare(name) if name in self.placeable else
                self.grads[name])

    def close(self):
        """Removes the gradient hooks (the client is going)."""
        for handle in self.hooks + self.forward_hooks:
            handle.remove()
        self.hooks.clear()
        self.forward_hooks.clear()

    def step(self, step_id, values, check_first=False):
        """Enqueues one step with each param group's (lr, weight_decay,
        adamw_lr, adamw_weight_decay) by index (`values`); raises a
        previous async step's error. `check_first` (an optimizer's first
        step): waits for the step and returns its StepOutcome, enqueuing
        nothing more when the workers had applied this id before (an
        earlier run of the job); None otherwise."""
        if self.forward_waits:
            # The worker may still read the last step's gradients.
            self.wait_for_parameters(0)
        read = {}  # what the worker reads of each marked matrix
        for name, p, _ in self.lent:
            if local(p).data_ptr() != self.data_ptrs[name]:
                raise RuntimeError(
                    f"muonps.Muon: {name!r}.data was replaced after the job "
                    "started; the worker updates the original storage (copy "
                    "values in with param.data.copy_(...) instead)")
            grad = None if p.grad is None else local(p.grad)
            if grad is not None and self._places(name) and \
                    _placeable(grad, local(p)) and self._place(name, grad):
                pass  # read where backward left it: no copy, no zeroing
            else:
                placed = name in self.placeable
                buffer = self._buffer(name)
                if grad is None:
                    if name in self.dirty:
                        buffer.zero_()
                        self.dirty.discard(name)
                    grad = buffer
                elif grad.data_ptr() == buffer.data_ptr():
                    self.dirty.add(name)
                else:
                    buffer.copy_(grad)
                    self.dirty.add(name)
                    grad = buffer
                    if not is_dtensor(p):
                        p.grad = buffer
                if placed:
                    self.client.place_gradient(name, buffer)
            if name in self.ready:
                read[name] = _mark(grad)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        # The worker reads each matrix's last mark before the step: one
        # written since its hook marked it (copied or zeroed above, clipped
        # or unscaled in place, or another tensor now) is marked again,
        # after that write. The others the step itself marks on this stream.
        for name, mark in list(self.ready.items()):
            if read[name] != mark:
                self.client.gradient_ready(name, stream)
        self.client.step(step_id, values, stream=stream, async_=True,
                         forward_waits=self.forward_waits)
        self.ready.clear()
        self.waited = -1
        outcome = None
        if check_first:
            outcome = self.client.wait()
            if outcome.already_applied:
                return outcome
        # Enqueued after the workers' updates on the trainer's stream, once
        # per call: the client steps none of these tensors. Under forward
        # waits it needs only the AdamW means the workers averaged.
        if self.adamw is not None:
            if self.forward_waits and self.workers_average:
                self.wait_for_parameters(0)
            self.adamw.step(values)
        return outcome

    def wait(self):
        """The last step's outcome (raises its error): a StepOutcome."""
        return self.client.wait()

    def zero_grad(self, set_to_none=True):
        """After the optimizer's own zero_grad. A matrix whose gradient the
        step hands over where it lies keeps what that did (None, or zeroed
        in place, or None left None as torch does): backward allocates the
        next one, or adds into the kept one, which the worker reads in
        place. The other gradients are zeroed in their buffers (never set
        to None), once the worker read the last step's: lent ones, and under
        forward waits (or for a gradient CUDA cannot lend) the optimizer's
        own buffers of the placed matrices."""
        if self.forward_waits:
            self.wait_for_parameters(0)
        for name, p, _ in self.lent:
            if self._places(name):
                continue
            buffer = self._buffer(name)
            buffer.zero_()
            self.dirty.discard(name)
            if not is_dtensor(p):
                p.grad = buffer
