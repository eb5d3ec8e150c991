"""How a model's parameters live in the buffers a muonps client lends.

A `LentTensor` ties one torch parameter to its fp32 parameter and gradient
buffers in the client's POSIX shared-memory segment: `bind()` copies the
parameter's values in and re-points `param.data` at the buffer, so the
workers' in-place updates are the model's weights with no copy;
`release()` copies them back out into ordinary memory before the segment
goes away. Not thread-safe (the optimizer's thread only).
"""

import ctypes

import torch


def buffer_view(address, elements, shape):
    """A float32 tensor over `elements` floats at `address` (not owning them)."""
    array = (ctypes.c_float * elements).from_address(address)
    return torch.frombuffer(array, dtype=torch.float32).view(shape)


class LentTensor:
    """One declared tensor: name, route (Muon or AdamW) and its buffers."""

    def __init__(self, name, param, group, muon):
        self.name = name
        self.param = param
        self.group = group  # index into the optimizer's param_groups
        self.muon = muon
        self.shape = tuple(param.shape)
        self.experts = param.shape[0] if muon and param.dim() == 3 else 1
        self.value = None  # view of the parameter buffer
        self.grad = None  # view of the gradient buffer

    def bind(self, param_address, grad_address, elements):
        if elements != self.param.numel():
            raise RuntimeError(
                f"muonps lent {elements} floats for {self.name!r}, which has "
                f"{self.param.numel()} elements")
        self.value = buffer_view(param_address, elements, self.shape)
        self.grad = buffer_view(grad_address, elements, self.shape)
        self.rebind()

    def rebind(self):
        """Points param.data at the lent buffer again if something moved it.

        Copies the parameter's current values in first; a no-op when the
        parameter already lives there.
        """
        if self.param.data.data_ptr() == self.value.data_ptr():
            return
        with torch.no_grad():
            self.value.copy_(self.param.data)
        self.param.data = self.value

    def load_grad(self):
        """Copies param.grad into the lent gradient buffer (zeros if None)."""
        grad = self.param.grad
        if grad is None:
            self.grad.zero_()
            return
        if grad.is_sparse:
            raise RuntimeError(f"{self.name!r} has a sparse gradient; muonps "
                               "takes dense gradients")
        self.grad.copy_(grad)


def release(lent):
    """Moves every parameter still in a lent buffer back to its own memory."""
    for t in lent:
        if t.value is not None and t.param.data.data_ptr() == t.value.data_ptr():
            t.param.data = t.value.clone()
        t.value = t.grad = None
