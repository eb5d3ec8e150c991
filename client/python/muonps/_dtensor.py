"""Parameters PyTorch already shards: DTensors, as FSDP2's `fully_shard`
makes them.

A matrix sharded on dimension 0 over a one-dimensional mesh of every rank
(placements `(Shard(0),)`, FSDP2's default) is a muonps `row_sharded`
matrix whose rows PyTorch has already split: muonps and DTensor both split
rows as torch.chunk does (common/row_ranges.h), so each rank lends its own
local shard and the gradient FSDP2 reduce-scattered into it, with no
gather in Python. The workers gather the rows of each matrix on its owner
and send each rank back the rows of its update.

HSDP, as `fully_shard(mesh=...)` makes it on a 2-D mesh (replicate x
shard, placements `(Replicate(), Shard(0))`), is taken too: the R =
mesh.size(0) replica groups of S = mesh.size(1) ranks each (the mesh's
ranks in row-major order, group r holding ranks r*S .. r*S+S-1) each split
a matrix's rows over their S ranks, rank % S holding torch.chunk's shard
of that index, and every group holds the same reduced gradients. The job
is then created with `replicas` = R (JobSpec.replicas), which every matrix
of the model must agree on.

A 3-D stack of experts is taken sharded on its experts (Shard(0), what
FSDP2 does to a 3-D parameter by default: each rank holds whole experts,
torch.chunk's split of dimension 0, and each expert's owner gathers it
from the one rank that holds it) or on its rows (Shard(1): each expert's
rows split as a matrix's are).

Any other placement of a matrix (a tensor-parallel shard of the columns,
on a 1-D or a 2-D mesh, other 2-D placements, a mesh of more dimensions,
Replicate or Partial) is refused, naming the parameter and its placement. A DTensor that is not a
matrix is stepped by the one AdamW of its trainer kind: on the host, the
client's (its local shard lent padded to the largest shard, see
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


def _is_row_shard(placement, ndim=2):
    """A Shard of a matrix's rows (Shard(0) of a 2-D one, also written
    Shard(-2)), or of a 3-D stack's experts or rows (Shard(0) or
    Shard(1))."""
    return placement.is_shard() and placement.dim % ndim in (
        (0,) if ndim == 2 else (0, 1))


def _refuse_placement(where, placements, ndim=2):
    """The ValueError for a matrix whose placements are not FSDP2's."""
    if any(p.is_shard() and not _is_row_shard(p, ndim) for p in placements):
        kind = f"tensor-parallel sharding on dimension {ndim - 1}"
    elif len(placements) == 1:
        kind = f"placement {placements[0]}"
    else:
        kind = f"placements {placements} on a {len(placements)}-D mesh"
    return ValueError(
        f"{where}: {kind} is not supported; muonps orthogonalizes whole "
        "matrices from row shards only, Shard(0) as FSDP2's fully_shard "
        "places them on a 1-D mesh, or (Replicate(), Shard(0)) as it "
        "places them on a 2-D mesh (HSDP). Keep tensor-parallel layers out "
        "of muonps (is_matrix) or shard them on dimension 0")


def shards_experts(p):
    """Whether the row-sharded DTensor `p` (check_row_sharded) is a 3-D
    stack split on its experts (Shard(0)), each rank holding whole experts,
    rather than on each expert's rows."""
    return p.dim() == 3 and p.placements[-1].dim % 3 == 0


def check_row_sharded(name, p, rank, world_size):
    """Raises ValueError naming `name` unless the DTensor `p` is a matrix,
    or a 3-D stack of experts, sharded as muonps's row_sharded layout, and
    returns its replicas R:

    - 1 for Shard(0) over a 1-D mesh of all `world_size` ranks in rank
      order, this rank holding its chunk_rows of world_size;
    - mesh.size(0) for HSDP, (Replicate(), Shard(0)) over a 2-D mesh of
      R x S = world_size ranks in row-major order, this rank holding its
      chunk_rows of S as shard rank % S (mesh.get_local_rank(1)).

    A stack's shard is Shard(0) (its experts, split as chunk_rows splits
    rows: shards_experts) or Shard(1) (each expert's rows).
    """
    mesh, placements = p.device_mesh, tuple(p.placements)
    where = f"muonps.Muon: {name!r} is a DTensor placed {placements} on {mesh}"
    ndim = p.dim()
    if ndim not in (2, 3):
        raise ValueError(
            f"{where}; muonps takes sharded 2-D matrices and 3-D expert "
            "stacks only: leave it unsharded or route it to AdamW with "
            "is_matrix")
    if mesh.ndim == 1:
        if not _is_row_shard(placements[0], ndim):
            raise _refuse_placement(where, placements, ndim)
        if mesh.size() != world_size or mesh.get_local_rank() != rank or (
                mesh.mesh.flatten().tolist() != list(range(world_size))):
            raise ValueError(
                f"{where}; its mesh must hold all {world_size} ranks in rank "
                f"order, with this rank ({rank}) at its own index")
        replicas, shards = 1, world_size
    elif mesh.ndim == 2:
        if not (placements[0].is_replicate() and
                _is_row_shard(placements[1], ndim)):
            raise _refuse_placement(where, placements, ndim)
        replicas, shards = mesh.size(0), mesh.size(1)
        if replicas * shards != world_size or (
                mesh.mesh.flatten().tolist() != list(range(world_size))):
            raise ValueError(
                f"{where}, ranks {mesh.mesh.tolist()}; an HSDP mesh "
                f"(replicate x shard) must hold all {world_size} ranks in "
                f"row-major order: {replicas} replica groups of {shards} "
                f"ranks, group r holding ranks r*{shards} .. "
                f"r*{shards}+{shards - 1} (init_device_mesh's order)")
        if mesh.get_local_rank(1) != rank % shards:
            raise ValueError(
                f"{where}; this rank ({rank}) is shard "
                f"{mesh.get_local_rank(1)} of its replica group, where "
                f"row-major order makes it shard {rank % shards}")
    else:
        raise ValueError(
            f"{where}; muonps takes DTensors on a 1-D mesh of every rank "
            "(FSDP2's fully_shard) or a 2-D replicate x shard mesh (HSDP), "
            f"not a {mesh.ndim}-D mesh")
    shard = rank % shards
    dim = placements[-1].dim % ndim
    what = "experts" if ndim == 3 and dim == 0 else "rows"
    begin, end = chunk_rows(p.shape[dim], shard, shards)
    rows = p.to_local().shape[dim]
    if rows != end - begin:
        of = (f"shard {shard} of the {shards} ranks of its replica group"
              if replicas > 1 else "it")
        raise ValueError(
            f"{where}: this rank holds {rows} {what}, torch.chunk's split "
            f"gives {of} {what} [{begin}, {end}) of {p.shape[dim]}; shard "
            "it evenly (FSDP2's default shard_placement_fn)")
    return replicas


def job_replicas(replicas):
    """The replicas of the job, from {matrix name: check_row_sharded's R}
    (1 when there is none): raises ValueError naming two matrices whose
    meshes disagree (the job has one replica group layout)."""
    values = sorted(set(replicas.values()))
    if len(values) > 1:
        first = {r: n for n, r in reversed(list(replicas.items()))}
        a, b = first[values[0]], first[values[1]]
        raise ValueError(
            f"muonps.Muon: {a!r} is sharded over {values[0]} replica "
            f"group(s) of its mesh and {b!r} over {values[1]}; every matrix "
            "of a muonps job must be on the same mesh (one fully_shard "
            "mesh for the whole model)")
    return values[0] if values else 1


def adamw_lent_elements(name, p):
    """The floats a host trainer lends for the DTensor AdamW tensor `p`:
    its largest local shard on any rank (every rank lends the same count;
    a shorter shard leaves zero padding after it). Raises ValueError naming
    `name` unless `p` is Shard(0) (as FSDP2's fully_shard places it) or
    Replicate on a 1-D mesh, or (Replicate(), Shard(0)) or Replicate on
    both dimensions of a 2-D mesh (HSDP)."""
    mesh, placements = p.device_mesh, tuple(p.placements)
    where = f"muonps.Muon: {name!r} is a DTensor placed {placements} on {mesh}"
    if mesh.ndim not in (1, 2) or (
            mesh.ndim == 2 and not placements[0].is_replicate()):
        raise ValueError(f"{where}; muonps takes DTensors on a 1-D mesh "
                         "(FSDP2's fully_shard) or placed (Replicate(), "
                         "Shard(0)) on a 2-D mesh (HSDP)")
    placement = placements[-1]
    if placement.is_replicate():
        return p.numel()
    if not (placement.is_shard() and placement.dim in (0, -p.dim())):
        raise ValueError(f"{where}; an AdamW tensor must be Shard(0), as "
                         "FSDP2's fully_shard places it, or Replicate")
    rows = p.shape[0]
    return -(-rows // mesh.size(mesh.ndim - 1)) * (p.numel() // max(rows, 1))


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
