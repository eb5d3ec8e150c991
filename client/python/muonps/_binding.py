"""How a model's parameters live in the buffers a muonps client lends.

A `LentTensor` ties one torch parameter to its fp32 parameter and gradient
buffers in the client's POSIX shared-memory segment: `bind()` copies the
parameter's values in and re-points `param.data` at the buffer, so the
workers' in-place updates are the model's weights with no copy;
`release()` copies them back out into ordinary memory before the segment
goes away. A `ShardLent` does the same for a DTensor's local shard (FSDP2),
whose storage FSDP2 keeps: it copies the shard and its gradient in before
each step and the updated shard back after it. A sharded AdamW tensor is
lent padded to the largest shard any rank holds (`lent_elements`, the same
on every rank, as the workers require); the padding stays zero, which
AdamW leaves zero. Not thread-safe (the optimizer's thread only).
"""

import ctypes

import torch


def buffer_view(address, elements, shape):
    """A float32 tensor over `elements` floats at `address` (not owning them)."""
    if elements == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=torch.float32)
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
        self.local_shape = self.shape  # what this rank holds
        # Floats the client lends for it (declared with add_tensor or
        # implied by add_matrix).
        self.lent_elements = param.numel()
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

    def store(self):
        """After a step: the parameter already is the lent buffer."""

    def release(self):
        """Moves the parameter back to its own memory if it lives in the
        lent buffer."""
        if self.value is not None and (
                self.param.data.data_ptr() == self.value.data_ptr()):
            self.param.data = self.value.clone()
        self.value = self.grad = None


class ShardLent(LentTensor):
    """A DTensor: a row-sharded matrix, whose lent buffers hold this rank's
    shard (its rows), or an AdamW tensor, whose lent buffers hold this
    rank's local shard padded to `lent_elements` (`padded`, from
    _dtensor.adamw_lent_elements). The DTensor keeps its own storage,
    copied to and from the buffers around each step."""

    def __init__(self, name, param, group, muon, padded=None):
        super().__init__(name, param, group, muon)
        self.local_shape = tuple(param.to_local().shape)
        self.lent_elements = param.to_local().numel() if padded is None \
            else padded

    def bind(self, param_address, grad_address, elements):
        shard = self.param.to_local()
        if elements != self.lent_elements:
            raise RuntimeError(
                f"muonps lent {elements} floats for {self.name!r}, whose "
                f"shard on this rank needs {self.lent_elements}")
        # The shard's own elements come first; the padding after them.
        self.value = buffer_view(param_address, shard.numel(),
                                 tuple(shard.shape))
        self.grad = buffer_view(grad_address, shard.numel(),
                                tuple(shard.shape))
        self.rebind()

    def rebind(self):
        """Copies the shard's current values in (the user may have set
        them since the last step)."""
        with torch.no_grad():
            self.value.copy_(self.param.to_local())

    def load_grad(self):
        grad = self.param.grad
        if grad is None:
            self.grad.zero_()
            return
        self.grad.copy_(grad.to_local())

    def store(self):
        with torch.no_grad():
            self.param.to_local().copy_(self.value)

    def release(self):
        self.value = self.grad = None


def release(lent):
    """Moves every parameter still in a lent buffer back to its own memory."""
    for t in lent:
        t.release()
