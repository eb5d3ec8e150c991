"""Parameters PyTorch already shards: DTensors, as FSDP2's `fully_shard`
makes them.

A matrix sharded on dimension 0 over a one-dimensional mesh of every rank
(placements `(Shard(0),)`, FSDP2's default) is a muonps `row_sharded`
matrix whose rows PyTorch has already split: muonps and DTensor both split
rows as torch.chunk does (common/row_ranges.h), so each rank lends its own
local shard and the gradient FSDP2 reduce-scattered into it, with no
gather in Python. The workers gather the rows of each matrix on its owner
and send each rank back the rows of its update. Any other placement of a
matrix (a tensor-parallel Shard(1), a 2-D mesh as in HSDP, Replicate or
Partial) and 3-D expert stacks sharded on the expert dimension are refused,
naming the parameter and its placement. A DTensor that is not a matrix
is stepped by the one AdamW of its trainer kind: on the host, the client's
(its local shard lent padded to the largest shard, see
adamw_lent_elements); on a GPU, torch.optim.AdamW (TorchAdamW), which
steps DTensors as they are.
"""

import functools

import torch


@functools.lru_cache(maxsize=None)
def dtensor_type():
    """torch's DTensor class, or None where torch has none (before 2.4)."""
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # absent, or an old torch failing inside the import
        return None
    return DTensor


def is_dtensor(tensor):
    cls = dtensor_type()
    return cls is not None and isinstance(tensor, cls)


def local(tensor):
    """A DTensor's local shard (the tensor itself otherwise)."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def chunk_rows(rows, rank, world_size):
    """This rank's rows [begin, end) as torch.chunk and Shard(0) split them
    (the rule of common/row_ranges.h)."""
    chunk = -(-rows // world_size)
    begin = min(rows, chunk * rank)
    return begin, min(rows, begin + chunk)


def check_row_sharded(name, p, rank, world_size):
    """Raises ValueError naming `name` unless the DTensor `p` is a matrix
    sharded as muonps's row_sharded layout: Shard(0) over a 1-D mesh of all
    `world_size` ranks in rank order, this rank holding its chunk_rows."""
    mesh, placements = p.device_mesh, tuple(p.placements)
    where = f"muonps.Muon: {name!r} is a DTensor placed {placements} on {mesh}"
    if p.dim() != 2:
        raise ValueError(
            f"{where}; muonps takes sharded 2-D matrices only (a 3-D expert "
            "stack sharded on its expert dimension is not a row shard): "
            "leave it unsharded or route it to AdamW with is_matrix")
    if mesh.ndim != 1:
        raise ValueError(
            f"{where}; muonps takes DTensors on a 1-D mesh of every rank "
            "(FSDP2's fully_shard), not a 2-D mesh (HSDP or tensor "
            "parallel with data parallel)")
    placement = placements[0]
    if not (placement.is_shard() and placement.dim in (0, -2)):
        kind = ("tensor-parallel sharding on dimension 1" if
                placement.is_shard() else f"placement {placement}")
        raise ValueError(
            f"{where}: {kind} is not supported; muonps orthogonalizes "
            "whole matrices from row shards only, Shard(0) as FSDP2's "
            "fully_shard places them. Keep tensor-parallel layers out of "
            "muonps (is_matrix) or shard them on dimension 0")
    if mesh.size() != world_size or mesh.get_local_rank() != rank or (
            mesh.mesh.flatten().tolist() != list(range(world_size))):
        raise ValueError(
            f"{where}; its mesh must hold all {world_size} ranks in rank "
            f"order, with this rank ({rank}) at its own index")
    begin, end = chunk_rows(p.shape[0], rank, world_size)
    rows = p.to_local().shape[0]
    if rows != end - begin:
        raise ValueError(
            f"{where}: this rank holds {rows} rows, torch.chunk's split "
            f"gives it rows [{begin}, {end}) of {p.shape[0]}; shard it "
            "evenly (FSDP2's default shard_placement_fn)")


def adamw_lent_elements(name, p):
    """The floats a host trainer lends for the DTensor AdamW tensor `p`:
    its largest local shard on any rank (every rank lends the same count;
    a shorter shard leaves zero padding after it). Raises ValueError naming
    `name` unless `p` is Shard(0) (as FSDP2's fully_shard places it) or
    Replicate on a 1-D mesh."""
    mesh, placements = p.device_mesh, tuple(p.placements)
    where = f"muonps.Muon: {name!r} is a DTensor placed {placements} on {mesh}"
    if mesh.ndim != 1:
        raise ValueError(f"{where}; muonps takes DTensors on a 1-D mesh "
                         "(FSDP2's fully_shard)")
    placement = placements[0]
    if placement.is_replicate():
        return p.numel()
    if not (placement.is_shard() and placement.dim in (0, -p.dim())):
        raise ValueError(f"{where}; an AdamW tensor must be Shard(0), as "
                         "FSDP2's fully_shard places it, or Replicate")
    rows = p.shape[0]
    return -(-rows // mesh.size()) * (p.numel() // max(rows, 1))


class TorchAdamW:
    """torch.optim.AdamW over a CUDA trainer's AdamW tensors (the one AdamW
    of CUDA trainers; the client's steps no tensor of theirs), with each
    param group's AdamW lr and weight decay set before every step."""

    def __init__(self, others, param_groups, defaults, fused):
        """`others`: (name, param, group index) triples; `fused`: torch's
        fused kernel (CUDA tensors that are not DTensors)."""
        groups = []
        for index, group in enumerate(param_groups):
            params = [p for _, p, g in others if g == index]
            if params:
                groups.append({"params": params, "group": index,
                               "weight_decay": group["adamw_weight_decay"]})
        self.optimizer = torch.optim.AdamW(
            groups, lr=1e-3, betas=defaults["adamw_betas"],
            eps=defaults["adamw_eps"],
            weight_decay=defaults["adamw_weight_decay"],
            **({"fused": True} if fused else {"foreach": False}))

    def step(self, values):
        """`values`: (lr, weight_decay, adamw_lr, adamw_weight_decay) by
        param group index, the step's (what the workers are sent too)."""
        for group in self.optimizer.param_groups:
            _, _, group["lr"], group["weight_decay"] = values[group["group"]]
        self.optimizer.step()

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)
