"""How a muonps.Muon starts its job: checks the param groups, decides which
parameters the workers step (lent) and which are left alone (frozen), starts
a private service when there is none (zero setup), and starts the client on
the CPU path (parameters in memory shared with the worker, muonps/_binding.py)
or the GPU path (matrices lent in place, muonps/_cuda.py). Also the tables
that turn the optimizer's string options into the C ABI's codes.

Every function here takes the optimizer (`opt`) and sets its client-side
attributes; muonps/optimizer.py owns their meaning.
"""

import os
import weakref

import torch

from . import _native, _service, _state
from ._binding import LentTensor, ShardLent, release
from ._cuda import CudaPath
from ._dtensor import (adamw_lent_elements, check_row_sharded, is_dtensor,
                       job_replicas, shards_experts)
from ._messages import explain_start_error
from .routing import LOG

LAYOUTS = {"replicated": _native.LAYOUT_REPLICATED,
           "unreduced": _native.LAYOUT_UNREDUCED}
ADJUST_LR = {"original": _native.ADJUST_LR_ORIGINAL,
             "match_rms_adamw": _native.ADJUST_LR_MATCH_RMS_ADAMW}
# Fixed for the whole job when it starts, so every group must share them.
JOB_KEYS = ("momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
            "adjust_lr_fn", "adamw_betas", "adamw_eps", "ns_algorithm")
NS_ALGORITHMS = {"auto": _native.NS_AUTO, "ns5": _native.NS_NS5,
                 "gram": _native.NS_GRAM}


def default_worker_socket(worker_id):
    """The socket `muonps-worker --worker_id ID` listens on by default:
    $XDG_RUNTIME_DIR/muonps/worker-ID.sock, else
    /tmp/muonps-UID/worker-ID.sock (server/worker/local_listener.h)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return f"{runtime}/muonps/worker-{worker_id}.sock"
    return f"/tmp/muonps-{os.geteuid()}/worker-{worker_id}.sock"


def start(opt):
    """Starts `opt`'s job and client (Muon._start: in the constructor, or
    at the first call that needs the client)."""
    c = opt._connection
    first = opt.param_groups[0]
    for group in opt.param_groups:
        for key in JOB_KEYS:
            if group[key] != first[key]:
                raise ValueError(
                    f"muonps.Muon: param groups differ in {key!r}; only "
                    "lr, weight_decay, adamw_lr and adamw_weight_decay "
                    "may differ (the others are the job's)")
    rank, world_size = _ranks(c["rank"], c["world_size"])
    opt._socket = c["worker_socket"] or os.environ.get(
        "MUONPS_WORKER_SOCKET") or (
        default_worker_socket(f"w{os.environ.get('LOCAL_RANK', rank)}"))
    lent, frozen, seen = [], [], set()
    replicas = {}  # each DTensor matrix's replica groups (HSDP: > 1)
    opt._router.decisions = []
    for index, group in enumerate(opt.param_groups):
        for p in group["params"]:
            name = opt._names[p]
            if name in seen:
                raise ValueError(f"muonps.Muon: two parameters are named {name!r}")
            seen.add(name)
            if not p.requires_grad:
                frozen.append(p)
                continue
            if p.dtype not in (torch.float32, torch.bfloat16) or (
                    p.dtype == torch.bfloat16 and p.device.type != "cuda"):
                raise TypeError(
                    f"muonps.Muon: {name!r} is {p.dtype} on {p.device}; "
                    "muonps takes float32 parameters on the CPU and "
                    "float32 or bfloat16 parameters on one GPU")
            muon = opt._router.decide(name, p, group)
            if muon and p.dim() not in (2, 3):
                raise ValueError(f"muonps.Muon: is_matrix chose {name!r} "
                                 f"of shape {tuple(p.shape)}; Muon takes "
                                 "2-D matrices and 3-D expert stacks")
            if not is_dtensor(p):
                lent.append(LentTensor(name, p, index, muon))
            elif muon:
                replicas[name] = check_row_sharded(name, p, rank, world_size)
                lent.append(ShardLent(name, p, index, muon))
            else:
                lent.append(ShardLent(
                    name, p, index, muon,
                    padded=(adamw_lent_elements(name, p)
                            if p.device.type != "cuda" else None)))
    if not any(t.muon for t in lent):
        raise ValueError("muonps.Muon: no parameter is a matrix (see "
                         "is_matrix); a muonps job needs at least one ("
                         + opt._router.describe() + ")")
    if rank == 0:
        LOG.info("%s", opt._router.describe())
    devices = {t.param.device for t in lent}
    if len(devices) != 1:
        raise TypeError(f"muonps.Muon: parameters on {sorted(map(str, devices))}; "
                        "one optimizer takes the parameters of one device")
    device = devices.pop()
    layout = LAYOUTS[c["layout"]]
    sharded = [t.name for t in lent if isinstance(t, ShardLent)]
    if sharded:
        plain = [t.name for t in lent if not isinstance(t, ShardLent)]
        if plain or c["layout"] != "replicated":
            raise ValueError(
                f"muonps.Muon: {sharded[0]!r} is a DTensor (FSDP2), so "
                "every trainable parameter must be one and the layout is "
                "theirs (row_sharded); "
                + (f"{plain[0]!r} is not a DTensor" if plain else
                   f"layout={c['layout']!r} was given"))
    # HSDP: the job's replica groups, one layout for every matrix.
    opt._replicas = job_replicas(replicas)
    if c["coordinator"] is None or os.environ.get(
            "MUONPS_LOCAL_WORKERS") == "1":
        _start_private_service(opt, device, rank, world_size)
    try:
        if device.type == "cuda":
            _start_cuda(opt, device, lent, frozen, rank, world_size, layout)
        else:
            _start_cpu(opt, lent, frozen, rank, world_size, layout)
    except BaseException:
        if opt._service is not None:
            opt._service.close()
            opt._service = None
        raise
    # Where rank 0's state_dict() reads the other workers' momentum.
    opt._peers = _state.find_peers(opt, rank, world_size)
    # torch.distributed.checkpoint fakes a step to make the state of an
    # optimizer whose `state` is empty: muonps's lives in the workers.
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {}


def _sharded_layout(p):
    """The C ABI layout of the row-sharded DTensor matrix `p`."""
    return (_native.LAYOUT_ROW_SHARDED_EXPERTS if shards_experts(p)
            else _native.LAYOUT_ROW_SHARDED)


def _start_cpu(opt, lent, frozen, rank, world_size, layout):
    """Every tensor moved into memory shared with the local worker (see
    muonps/_binding.py): the matrices for the workers' Muon, the others for
    the client's AdamW (a DTensor's local shard, padded), the one AdamW of
    a host trainer. Param groups are registered before start."""
    c = opt._connection
    client = _create_client(opt, rank, world_size, "cpu")
    try:
        layer = 0
        for t in lent:
            sharded = isinstance(t, ShardLent)
            if t.muon:
                rows, cols = t.shape[-2:]
                client.add_matrix(
                    t.name, rows, cols, t.experts,
                    _sharded_layout(t.param) if sharded else layout, layer)
                layer += 1
            else:
                # A shard's gradient is FSDP2's, already reduced.
                client.add_tensor(t.name, t.lent_elements,
                                  _native.LAYOUT_REPLICATED if sharded
                                  else layout)
        for index in range(len(opt.param_groups)):
            client.set_group(index, [t.name for t in lent if t.group == index])
        _start_client(client, opt.defaults, c)
        for t in lent:
            t.bind(*client.buffers(t.name))
    except _native.MuonpsError as e:
        release(lent)
        client.close()
        raise explain_start_error(e, c["coordinator"], c["job"],
                                  opt._socket, "cpu") from e
    opt._client, opt._lent, opt._frozen = client, lent, frozen
    opt._finalizer = weakref.finalize(opt, _shut_down, client, lent,
                                      opt._service)


def _start_private_service(opt, device, rank, world_size):
    """Zero setup: this rank's own worker (as a child process) and, with
    no coordinator given, rank 0's coordinator, whose address the other
    ranks learn through torch.distributed (torchrun)."""
    c = opt._connection
    worker_device = _worker_device(device)
    coordinator = c["coordinator"]
    job = c["job"] if coordinator is not None else None
    token = None  # another rank's private coordinator's token
    if coordinator is None and world_size > 1:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                f"muonps.Muon: {world_size} ranks share one muonps "
                "service: call torch.distributed.init_process_group "
                "first (rank 0 then starts it), launch with `python -m "
                "muonps.run`, or pass coordinator='HOST:PORT' / set "
                "MUONPS_COORDINATOR")
        where = [None, None, None]
        if rank == 0:
            opt._service = _service.LocalService(
                worker_device, c["timeout"], worker_id="w0")
            where = [opt._service.coordinator, opt._service.job,
                     opt._service.token]
        dist.broadcast_object_list(where, src=0)
        coordinator, job, token = where
    if opt._service is None:
        opt._service = _service.LocalService(
            worker_device, c["timeout"], coordinator=coordinator,
            job=job, worker_id=f"w{rank}", token=token)
    c.update(coordinator=opt._service.coordinator, job=opt._service.job)
    opt._socket = opt._service.socket
    # This process's client (muonps::Client) reads its token from
    # $MUONPS_TOKEN_FILE; restored when the service closes.
    opt._service.export_token()


def _start_cuda(opt, device, lent, frozen, rank, world_size, layout):
    """Matrices lent in place to the worker on `device`; the rest
    stepped by torch's AdamW (see muonps/_cuda.py)."""
    c = opt._connection
    client = _create_client(opt, rank, world_size, _worker_device(device))
    matrices = [(t.name, t.param, t.group) for t in lent if t.muon]
    others = [(t.name, t.param, t.group) for t in lent if not t.muon]
    try:
        for layer, (name, p, _) in enumerate(matrices):
            rows, cols = p.shape[-2:]
            experts = p.shape[0] if p.dim() == 3 else 1
            client.add_matrix(name, rows, cols, experts,
                              _sharded_layout(p) if is_dtensor(p)
                              else layout, layer)
        # Unreduced: the workers average the AdamW tensors' gradients.
        average = c["layout"] == "unreduced"
        if average:
            for name, p, _ in others:
                client.add_tensor(name, p.numel(), layout)
        d = opt.defaults
        # Lends the matrices (before start: the worker maps them then).
        cuda = CudaPath(client, device, matrices, others,
                        opt.param_groups, d, average_others=average)
        _start_client(client, d, c)
        opt._cuda = cuda
    except _native.MuonpsError as e:
        client.close()
        raise explain_start_error(e, c["coordinator"], c["job"],
                                  opt._socket, _worker_device(device)) from e
    opt._client, opt._frozen = client, frozen
    opt._finalizer = weakref.finalize(opt, _shut_down_cuda, client,
                                      opt._service, cuda)


def _create_client(opt, rank, world_size, device):
    """The client of `opt`'s job on `device` ("cpu" or "cuda:N"), with
    the job's HSDP replica groups (opt._replicas) set; a MuonpsError says
    what is missing (unreadable credentials, say)."""
    c = opt._connection
    try:
        client = _native.NativeClient(c["coordinator"], c["job"], opt._socket,
                                      rank, world_size, c["timeout"],
                                      device=device)
    except _native.MuonpsError as e:
        raise explain_start_error(e, c["coordinator"], c["job"],
                                  opt._socket, device) from e
    # HSDP's replica groups decide a row-sharded matrix's rows: set before
    # any matrix is added.
    if opt._replicas > 1:
        try:
            client.set_replicas(opt._replicas)
        except _native.MuonpsError:
            client.close()
            raise
    return client


def _worker_device(device):
    """The worker's --device for parameters on `device`: "cpu" or
    "cuda:N" (an index-less "cuda" is the current device)."""
    if device.type != "cuda":
        return "cpu"
    index = device.index if device.index is not None else (
        torch.cuda.current_device())
    return f"cuda:{index}"


def _start_client(client, d, c):
    """Starts `client` with the optimizer's defaults `d` as the job's (which
    expects c["dedicated_workers"] workers with no trainer, may or may not
    reset lost momentum, and checkpoints into c["checkpoint_dir"], if
    set)."""
    client.expect_dedicated_workers(c["dedicated_workers"])
    client.allow_momentum_reset(c["allow_momentum_reset"])
    if c["checkpoint_dir"]:
        client.set_checkpointing(os.path.abspath(c["checkpoint_dir"]),
                                 c["checkpoint_every"])
    client.start(d["lr"], d["weight_decay"], d["momentum"], d["nesterov"],
                 d["ns_steps"], ADJUST_LR[d["adjust_lr_fn"] or "original"],
                 d["lr"] if d["adamw_lr"] is None else d["adamw_lr"],
                 d["adamw_betas"], d["adamw_eps"], d["adamw_weight_decay"],
                 NS_ALGORITHMS[d["ns_algorithm"]], d["eps"],
                 d["ns_coefficients"])


def _shut_down_cuda(client, service=None, cuda=None):
    if cuda is not None:
        cuda.close()  # no gradient hook calls the client after this
    try:
        client.wait()
    except _native.MuonpsError:
        pass  # the step's error was the user's to collect
    client.close()
    if service is not None:
        service.close()


def _shut_down(client, lent, service=None):
    release(lent)
    client.close()
    if service is not None:
        service.close()


def _ranks(rank, world_size):
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    return rank, world_size
