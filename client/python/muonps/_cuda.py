"""The GPU path of muonps.Muon: CUDA parameters stay where they are.

Matrices are lent to the muonps-worker on the same GPU by CUDA IPC: the
parameter's own storage (updated in place by the worker) and one gradient
buffer per matrix that becomes `param.grad` (backward accumulates into it in
place; a gradient that lands elsewhere is copied in at the step), fp32 or
bf16 (the worker keeps fp32 momentum and rounds each bf16 update once). The
trainer's current stream records an event the worker's stream waits on and
then waits, on the device, for the worker's updates, so `step()` returns
once the step is enqueued. Param groups are registered when the client
starts and each step carries every group's lr and weight decay by index
(no passes over the parameters in Python). Every other tensor is stepped
by torch's own fused AdamW on the trainer's stream, the one AdamW of a
CUDA trainer (the client steps none of its tensors). A DTensor
(FSDP2) lends its local shard in place; its gradient, a DTensor FSDP2
reduce-scatters anew each step, is copied into the lent buffer at the step
(see muonps/_dtensor.py). Not thread-safe (the optimizer's thread only).
"""

import torch

from ._dtensor import TorchAdamW, is_dtensor, local

# What the worker takes: fp32 momentum either way; a bf16 parameter gets
# each update rounded once.
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


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
        self.grads = {}
        for name, p, _ in self.lent:
            shard = local(p)
            if not shard.is_contiguous():
                raise TypeError(f"muonps.Muon: {name!r} is not contiguous; "
                                "the worker updates it in place")
            buffer = torch.zeros_like(shard,
                                      memory_format=torch.contiguous_format)
            if p.grad is not None:
                buffer.copy_(local(p.grad))
            self.grads[name] = buffer
            if not is_dtensor(p):
                p.grad = buffer
            client.lend_cuda(name, buffer, shard, _DTYPES[p.dtype])
        self.data_ptrs = {name: local(p).data_ptr() for name, p, _ in self.lent}
        for index in range(len(param_groups)):
            client.set_group(index, [n for n, _, g in self.lent if g == index])
        self.adamw = None
        if others:
            self.adamw = TorchAdamW(
                others, param_groups, defaults,
                fused=not any(is_dtensor(p) for _, p, _ in others))

    def step(self, step_id, values, check_first=False):
        """Enqueues one step with each param group's (lr, weight_decay,
        adamw_lr, adamw_weight_decay) by index (`values`); raises a
        previous async step's error. `check_first` (an optimizer's first
        step): waits for the step and returns its StepOutcome, enqueuing
        nothing more when the workers had applied this id before (an
        earlier run of the job); None otherwise."""
        for name, p, _ in self.lent:
            if local(p).data_ptr() != self.data_ptrs[name]:
                raise RuntimeError(
                    f"muonps.Muon: {name!r}.data was replaced after the job "
                    "started; the worker updates the original storage (copy "
                    "values in with param.data.copy_(...) instead)")
            buffer = self.grads[name]
            if p.grad is None:
                buffer.zero_()
            elif local(p.grad).data_ptr() != buffer.data_ptr():
                buffer.copy_(local(p.grad))
            if not is_dtensor(p):
                p.grad = buffer
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self.client.step(step_id, values, stream=stream, async_=True)
        outcome = None
        if check_first:
            outcome = self.client.wait()
            if outcome.already_applied:
                return outcome
        # Enqueued after the workers' updates on the trainer's stream, once
        # per call: the client steps none of these tensors.
        if self.adamw is not None:
            self.adamw.step(values)
        return outcome

    def wait(self):
        """The last step's outcome (raises its error): a StepOutcome."""
        return self.client.wait()

    def zero_grad(self):
        """Lent gradients are zeroed in place (never set to None)."""
        for name, p, _ in self.lent:
            buffer = self.grads[name]
            buffer.zero_()
            if not is_dtensor(p):
                p.grad = buffer
