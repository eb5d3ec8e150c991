"""DistributedDataParallel without DDP's all-reduce: muonps reduces instead.

With plain DDP every rank all-reduces every gradient, muonps.Muon
(layout="replicated") steps each matrix on the worker that owns it, and the
workers broadcast the update: an all-reduce plus a broadcast. With
``skip_allreduce_hook`` DDP keeps each rank's own gradient (the mean over its
part of the batch) and muonps.Muon(layout="unreduced") lends it as is: the
workers reduce every matrix to its owner and average it there, so the
reduce plus the update's broadcast cost what DDP's all-reduce alone did
(Muon at DDP's communication cost). The workers also average the AdamW
tensors' gradients over the trainers before each client's AdamW step, so
both optimizers see what DDP's all-reduce would have given them.

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, muonps.ddp.skip_allreduce_hook)
    opt = muonps.Muon(ddp.module.named_parameters(), lr=0.02,
                      layout="unreduced", coordinator=..., job=...,
                      worker_socket=..., rank=rank, world_size=world)

Contract: after registering the hook, no gradient of the model is averaged
by DDP. Every parameter that receives a gradient must therefore be stepped
by muonps.Muon with layout="unreduced" (matrices by the workers, the other
tensors by its AdamW): a parameter stepped by any other optimizer would be
updated with this rank's local gradient only and the ranks' replicas would
drift apart. The ranks no longer meet in backward; they meet in
``optimizer.step()``, which every rank must call the same number of times
(the workers agree on the step id). DDP still broadcasts the parameters at
construction and, with broadcast_buffers=True, the module buffers at each
forward. The hook is stateless and may be shared by several DDP modules;
register it with ``state=None``.
"""

import torch

__all__ = ["skip_allreduce_hook"]


def _bucket_tensor(bucket):
    # GradBucket.buffer() since torch 1.10; get_tensor() before it.
    if hasattr(bucket, "buffer"):
        return bucket.buffer()
    return bucket.get_tensor()


def skip_allreduce_hook(state, bucket):
    """A DDP communication hook that returns the bucket's local gradient.

    Returns a completed ``torch.futures.Future`` holding the bucket's
    flattened gradients unchanged, so DDP copies this rank's own gradients
    back into ``param.grad`` and sends nothing. ``state`` is ignored.
    """
    del state  # stateless: the workers do the reduction
    future = torch.futures.Future()
    future.set_result(_bucket_tensor(bucket))
    return future
