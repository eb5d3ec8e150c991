"""The GPU path of muonps.Muon: CUDA parameters stay where they are.

Matrices are lent to the muonps-worker on the same GPU by CUDA IPC: the
parameter's own storage (updated in place by the worker) and one gradient
buffer per matrix that becomes `param.grad` (backward accumulates into it in
place; a gradient that lands elsewhere is copied in at the step), fp32 or
bf16 (the worker keeps fp32 momentum and rounds each bf16 update once). The
trainer's current stream records an event the worker's stream waits on and
then waits, on the device, for the worker's updates, so `step()` returns
once the step is enqueued. Per-group lr and weight decay travel with the
step (no passes over the parameters in Python). Every other tensor is
stepped by torch's own fused AdamW on the trainer's stream. Not
thread-safe (the optimizer's thread only).
"""

import torch

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
        self.lent = list(matrices) + (list(others) if average_others else [])
        self.grads = {}
        for name, p, _ in self.lent:
            buffer = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if p.grad is not None:
                buffer.copy_(p.grad)
            self.grads[name] = buffer
            p.grad = buffer
            client.lend_cuda(name, buffer, p, _DTYPES[p.dtype])
        self.data_ptrs = {name: p.data_ptr() for name, p, _ in self.lent}
        for index in range(len(param_groups)):
            client.set_group(index, [n for n, _, g in matrices if g == index])
        self.adamw = None
        if others:
            groups = []
            for index, group in enumerate(param_groups):
                params = [p for _, p, g in others if g == index]
                if params:
                    groups.append({"params": params, "group": index,
                                   "weight_decay": group["adamw_weight_decay"]})
            self.adamw = torch.optim.AdamW(
                groups, lr=1e-3, betas=defaults["adamw_betas"],
                eps=defaults["adamw_eps"],
                weight_decay=defaults["adamw_weight_decay"], fused=True)

    def step(self, step_id, param_groups, adamw_lr_of):
        """Enqueues one step; raises a previous async step's error."""
        for name, p, _ in self.lent:
            if p.data_ptr() != self.data_ptrs[name]:
                raise RuntimeError(
                    f"muonps.Muon: {name!r}.data was replaced after the job "
                    "started; the worker updates the original storage (copy "
                    "values in with param.data.copy_(...) instead)")
            buffer = self.grads[name]
            if p.grad is None:
                buffer.zero_()
            elif p.grad.data_ptr() != buffer.data_ptr():
                buffer.copy_(p.grad)
            p.grad = buffer
        stream = torch.cuda.current_stream(self.device).cuda_stream
        pending, already = self.client.step_with(
            step_id, [g["lr"] for g in param_groups],
            [g["weight_decay"] for g in param_groups], stream=stream,
            async_=True)
        if self.adamw is not None and not already:
            for group in self.adamw.param_groups:
                group["lr"] = adamw_lr_of(param_groups[group["group"]])
                group["weight_decay"] = (
                    param_groups[group["group"]]["adamw_weight_decay"])
            self.adamw.step()
        return already

    def wait(self):
        """The last step's outcome (raises its error); True if it had been
        applied before."""
        return self.client.wait()

    def zero_grad(self):
        """Lent gradients are zeroed in place (never set to None)."""
        for name, p, _ in self.lent:
            buffer = self.grads[name]
            buffer.zero_()
            p.grad = buffer
