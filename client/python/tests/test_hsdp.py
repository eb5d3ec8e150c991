"""HSDP (`fully_shard` on a 2-D replicate x shard mesh) without torchrun:
which DTensor placements muonps takes and how many replica groups they
make (muonps/_dtensor.py), against stand-ins for DeviceMesh, DTensor and
their placements, so that these run on Debian's torch 1.13, which has no
DTensor; the job's replicas through the C ABI (muonps_client_set_replicas,
no service needed); and the client muonps.Muon creates with them.
test_fsdp.py runs the whole of it on four ranks (torch >= 2.4).
"""

import pytest
import torch

from muonps import _dtensor, _native, _startup


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True

    def is_replicate(self):
        return False

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate:
    def is_shard(self):
        return False

    def is_replicate(self):
        return True

    def __repr__(self):
        return "Replicate()"


class Mesh:
    """A DeviceMesh of `ranks` (nested lists) seen from rank `rank`."""

    def __init__(self, ranks, rank):
        self.mesh = torch.tensor(ranks)
        self.ndim = self.mesh.dim()
        self.rank = rank

    def size(self, mesh_dim=None):
        return self.mesh.numel() if mesh_dim is None else (
            self.mesh.shape[mesh_dim])

    def get_local_rank(self, mesh_dim=None):
        where = (self.mesh == self.rank).nonzero()[0].tolist()
        return where[0 if mesh_dim is None else mesh_dim]

    def __repr__(self):
        return f"DeviceMesh('cpu', {self.mesh.tolist()})"


class DTensor:
    """A parameter of global `shape` holding `local_rows` of its first
    dimension here (or of dimension `dim`)."""

    def __init__(self, shape, local_rows, mesh, placements, dim=0):
        self.shape = torch.Size(shape)
        self.device_mesh = mesh
        self.placements = tuple(placements)
        local = list(shape)
        local[dim] = local_rows
        self._local = torch.zeros(local)

    def dim(self):
        return len(self.shape)

    def numel(self):
        return self.shape.numel()

    def to_local(self):
        return self._local


HSDP = (Replicate(), Shard(0))


def hsdp(rank, rows=31, local_rows=None, ranks=((0, 1), (2, 3))):
    """A 31 x 5 matrix on a 2 x 2 HSDP mesh: shard rank % 2 of a replica
    group holds torch.chunk's 16 or 15 rows unless `local_rows` says."""
    if local_rows is None:
        begin, end = _dtensor.chunk_rows(rows, rank % 2, 2)
        local_rows = end - begin
    return DTensor((rows, 5), local_rows, Mesh([list(r) for r in ranks], rank),
                   HSDP)


@pytest.mark.parametrize("rank", range(4))
def test_an_hsdp_matrix_is_row_sharded_over_its_replica_group(rank):
    assert _dtensor.check_row_sharded("up.weight", hsdp(rank), rank, 4) == 2


def test_a_one_dimensional_fsdp_matrix_has_one_replica_group():
    p = DTensor((31, 5), 15, Mesh([0, 1], 1), (Shard(0),))
    assert _dtensor.check_row_sharded("up.weight", p, 1, 2) == 1
    # Eight replica groups of one rank each hold every row.
    p = DTensor((31, 5), 31, Mesh([[r] for r in range(8)], 5), HSDP)
    assert _dtensor.check_row_sharded("up.weight", p, 5, 8) == 8


def test_rows_of_the_whole_world_split_are_refused_naming_the_shard():
    # 31 rows over all 4 ranks would give rank 3 rows [24, 31); HSDP gives
    # shard 1 of its group [16, 31).
    with pytest.raises(ValueError) as raised:
        _dtensor.check_row_sharded("up.weight", hsdp(3, local_rows=7), 3, 4)
    message = str(raised.value)
    assert "'up.weight'" in message and "[[0, 1], [2, 3]]" in message
    assert "holds 7 rows" in message
    assert "shard 1 of the 2 ranks of its replica group rows [16, 31)" in (
        message)


@pytest.mark.parametrize("ranks, world_size", [
    (((0, 2), (1, 3)), 4),  # column-major
    (((1, 0), (2, 3)), 4),
    (((0, 1), (2, 3)), 8),  # not every rank
])
def test_a_mesh_not_in_row_major_order_of_every_rank_is_refused(
        ranks, world_size):
    p = hsdp(2, ranks=ranks)
    with pytest.raises(ValueError) as raised:
        _dtensor.check_row_sharded("mix.weight", p, 2, world_size)
    message = str(raised.value)
    assert "'mix.weight'" in message and "DeviceMesh(" in message
    assert f"ranks {[list(r) for r in ranks]}" in message
    assert f"all {world_size} ranks in row-major order" in message
    assert "2 replica groups of 2 ranks" in message


@pytest.mark.parametrize("placements, what", [
    ((Replicate(), Shard(1)), "tensor-parallel sharding on dimension 1"),
    ((Shard(0), Shard(1)), "tensor-parallel sharding on dimension 1"),
    ((Shard(1), Replicate()), "tensor-parallel sharding on dimension 1"),
    ((Shard(0), Replicate()),
     "placements (Shard(dim=0), Replicate()) on a 2-D mesh"),
    ((Replicate(), Replicate()),
     "placements (Replicate(), Replicate()) on a 2-D mesh"),
])
def test_other_two_dimensional_placements_are_refused_naming_them(
        placements, what):
    p = DTensor((8, 8), 4, Mesh([[0, 1], [2, 3]], 0), placements)
    with pytest.raises(ValueError) as raised:
        _dtensor.check_row_sharded("attn.wo", p, 0, 4)
    message = str(raised.value)
    assert "'attn.wo'" in message and what in message, message
    assert "is not supported" in message


def test_a_one_dimensional_tensor_parallel_matrix_is_still_refused():
    p = DTensor((8, 8), 8, Mesh([0, 1], 0), (Shard(1),))
    with pytest.raises(ValueError, match="tensor-parallel") as raised:
        _dtensor.check_row_sharded("attn.wo", p, 0, 2)
    assert "Shard(dim=1)" in str(raised.value)


# A 3-D expert stack as FSDP2 shards it by default, Shard(0): 5 experts over
# two ranks, 3 + 2 whole experts as torch.chunk splits them, taken with the
# experts' layout; Shard(1) splits each expert's rows, the rows' layout.
@pytest.mark.parametrize("rank,local", [(0, 3), (1, 2)])
def test_a_stack_sharded_on_its_experts_is_taken_whole_experts(rank, local):
    p = DTensor((5, 6, 4), local, Mesh([0, 1], rank), (Shard(0),))
    assert _dtensor.check_row_sharded("moe.experts", p, rank, 2) == 1
    assert _dtensor.shards_experts(p)
    assert _startup._sharded_layout(p) == _native.LAYOUT_ROW_SHARDED_EXPERTS


def test_a_stack_sharded_on_each_experts_rows_is_row_sharded():
    p = DTensor((5, 7, 4), 3, Mesh([0, 1], 1), (Shard(1),), dim=1)
    assert _dtensor.check_row_sharded("moe.experts", p, 1, 2) == 1
    assert not _dtensor.shards_experts(p)
    assert _startup._sharded_layout(p) == _native.LAYOUT_ROW_SHARDED
    # Shard(-3) is Shard(0).
    q = DTensor((5, 6, 4), 2, Mesh([0, 1], 1), (Shard(-3),))
    assert _dtensor.shards_experts(q)


def test_a_stack_in_hsdp_splits_its_experts_within_the_replica_group():
    p = DTensor((5, 6, 4), 2, Mesh([[0, 1], [2, 3]], 3), HSDP)
    assert _dtensor.check_row_sharded("moe.experts", p, 3, 4) == 2
    assert _dtensor.shards_experts(p)


def test_a_stack_with_another_split_of_its_experts_is_refused_naming_it():
    p = DTensor((5, 6, 4), 1, Mesh([0, 1], 1), (Shard(0),))
    with pytest.raises(ValueError) as raised:
        _dtensor.check_row_sharded("moe.experts", p, 1, 2)
    message = str(raised.value)
    assert "'moe.experts'" in message and "holds 1 experts" in message
    assert "experts [3, 5) of 5" in message, message


def test_a_stack_sharded_on_its_columns_is_refused_as_tensor_parallel():
    p = DTensor((5, 6, 4), 2, Mesh([0, 1], 0), (Shard(2),), dim=2)
    with pytest.raises(ValueError, match="tensor-parallel sharding on "
                       "dimension 2") as raised:
        _dtensor.check_row_sharded("moe.experts", p, 0, 2)
    assert "'moe.experts'" in str(raised.value)


def test_a_three_dimensional_mesh_is_refused_naming_it():
    p = DTensor((8, 8), 4,
                Mesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], 0),
                (Replicate(), Replicate(), Shard(0)))
    with pytest.raises(ValueError, match="not a 3-D mesh") as raised:
        _dtensor.check_row_sharded("w", p, 0, 8)
    assert "'w'" in str(raised.value)


def test_the_job_takes_the_replica_groups_every_matrix_agrees_on():
    assert _dtensor.job_replicas({}) == 1
    assert _dtensor.job_replicas({"up.weight": 2, "mix.weight": 2}) == 2
    with pytest.raises(ValueError) as raised:
        _dtensor.job_replicas({"up.weight": 2, "mix.weight": 2,
                               "out.weight": 1})
    message = str(raised.value)
    assert "'out.weight' is sharded over 1" in message
    assert "'up.weight' over 2" in message


def test_an_hsdp_adamw_tensor_is_lent_padded_to_its_groups_largest_shard():
    # A bias of 31 over 2 ranks a group: 16 floats on every rank.
    bias = DTensor((31,), 15, Mesh([[0, 1], [2, 3]], 3), HSDP)
    assert _dtensor.adamw_lent_elements("up.bias", bias) == 16
    whole = DTensor((31,), 31, Mesh([[0, 1], [2, 3]], 3),
                    (Replicate(), Replicate()))
    assert _dtensor.adamw_lent_elements("up.bias", whole) == 31
    odd = DTensor((31,), 15, Mesh([[0, 1], [2, 3]], 3), (Shard(0), Shard(0)))
    with pytest.raises(ValueError, match="'up.bias'"):
        _dtensor.adamw_lent_elements("up.bias", odd)


def test_set_replicas_refuses_bad_values_naming_them():
    # The C ABI's check, no service needed: 3 replica groups cannot divide
    # 4 trainers, and once a row-sharded matrix is declared its rows are
    # fixed.
    client = _native.NativeClient("127.0.0.1:1", "job",
                                  "/tmp/muonps-none.sock", 3, 4, 1)
    try:
        for bad, what in ((-1, "replicas: -1 < 0"),
                          (3, "replicas: 3 replica groups do not divide "
                              "trainer_count 4")):
            with pytest.raises(_native.MuonpsError, match=what) as raised:
                client.set_replicas(bad)
            assert raised.value.code_name == "INVALID_ARGUMENT"
        client.set_replicas(2)
        # 1 row over the 2 ranks of a group leaves none to shard 1.
        with pytest.raises(_native.MuonpsError,
                           match="2 trainers of a replica group"):
            client.add_matrix("tiny", 1, 4, 1, _native.LAYOUT_ROW_SHARDED, 0)
        client.add_matrix("w", 31, 4, 1, _native.LAYOUT_ROW_SHARDED, 0)
        with pytest.raises(_native.MuonpsError, match='"w"') as raised:
            client.set_replicas(4)
        assert raised.value.code == _native.FAILED_PRECONDITION
    finally:
        client.close()


class _Recorder:
    """Stands in for NativeClient: records the calls made on it."""

    calls = []

    def __init__(self, *args, **kwargs):
        _Recorder.calls = [("create", args[3], args[4])]

    def set_replicas(self, replicas):
        _Recorder.calls.append(("set_replicas", replicas))


class _Optimizer:
    def __init__(self, replicas):
        self._connection = {"coordinator": "127.0.0.1:1", "job": "job",
                            "timeout": 1}
        self._socket = "/tmp/muonps-none.sock"
        self._replicas = replicas


@pytest.mark.parametrize("replicas, calls", [
    (1, [("create", 3, 4)]),
    (2, [("create", 3, 4), ("set_replicas", 2)]),
])
def test_the_client_is_created_with_the_jobs_replicas_before_any_matrix(
        monkeypatch, replicas, calls):
    monkeypatch.setattr(_native, "NativeClient", _Recorder)
    _startup._create_client(_Optimizer(replicas), 3, 4, "cpu")
    assert _Recorder.calls == calls
