"""muonps.Muon's state_dict and load_state_dict beyond torch's own: the
step id, AdamW state and the workers' momentum, copied through the client or
referenced in the workers' checkpoints (muonps/optimizer.py calls these)."""

import os
import re
import socket
import time
import warnings

import torch

from . import _native


def checkpoint_reference(opt):
    """{"dir", "step"} of the workers' checkpoint of the last step,
    once this rank's worker wrote it (waits up to the timeout)."""
    directory = opt._connection["checkpoint_dir"]
    if not directory:
        raise ValueError("muonps.Muon: state_dict(checkpoint=True) needs "
                         "checkpoint_dir")
    last = opt._step_id - 1
    deadline = time.monotonic() + opt._connection["timeout"]
    written = opt._client.last_checkpoint_step()
    while written < last and time.monotonic() < deadline:
        time.sleep(0.02)
        written = opt._client.last_checkpoint_step()
    if last < 0 or written != last:
        raise RuntimeError(
            f"muonps.Muon: the worker's last checkpoint is of step "
            f"{written}, not of the last step {last}: choose "
            "checkpoint_every to divide it, or call checkpoint() before "
            "that step")
    return {"dir": os.path.abspath(directory), "step": last}


def find_peers(opt, rank, world_size):
    """The other ranks' workers this process can read momentum from: every
    rank tells the others (torch.distributed, while every rank starts its
    optimizer) its host and its worker's socket; those on this host are
    kept as [(rank, socket)]. Without torch.distributed, none."""
    dist = torch.distributed
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()
                               and dist.get_world_size() == world_size):
        return []
    where = [None] * world_size
    dist.all_gather_object(where, (socket.gethostname(), opt._socket))
    host = socket.gethostname()
    return [(r, path) for r, (h, path) in enumerate(where)
            if r != rank and h == host]


def _matrices(opt):
    """(name, param, experts, shape of one expert) of every matrix."""
    if opt._cuda is not None:
        return [(name, p, p.shape[0] if p.dim() == 3 else 1,
                 tuple(p.shape[-2:])) for name, p, _ in opt._cuda.matrices]
    return [(t.name, t.param, t.experts, tuple(t.shape[-2:]))
            for t in opt._lent if t.muon]


def _peer_client(opt, rank, path):
    """A client of another rank's worker, for its momentum only."""
    clients = opt.__dict__.setdefault("_peer_clients", {})
    if rank not in clients:
        c = opt._connection
        # Only its momentum is read: the rank and count are placeholders.
        clients[rank] = _native.NativeClient(
            c["coordinator"], c["job"], path, 0, 1, c["timeout"])
    return clients[rank]


def close_peers(opt):
    for client in opt.__dict__.pop("_peer_clients", {}).values():
        client.close()


def gather_momentum(opt):
    """({"name[e]": momentum} of every matrix whose owner this process
    reaches: its own worker, then the other ranks' workers on this host,
    [missing keys], {name: stacked momentum (E, rows, cols) or (rows,
    cols)})."""
    momentum, missing, stacks = {}, [], {}
    for name, p, experts, shape in _matrices(opt):
        buf = torch.zeros((experts, *shape) if p.dim() == 3 else shape,
                          dtype=torch.float32)
        stacks[name] = buf
        for e in range(experts):
            out = buf[e] if p.dim() == 3 else buf
            found = opt._client.get_momentum(name, e, out)
            for rank, path in opt._peers:
                if found:
                    break
                try:
                    found = _peer_client(opt, rank, path).get_momentum(
                        name, e, out)
                except _native.MuonpsError as error:
                    raise RuntimeError(
                        f"muonps.Muon: state_dict() could not read {name!r} "
                        f"from rank {rank}'s worker (unix:{path}): {error}. "
                        "Has that rank ended? Its worker ends with it: after "
                        "a rank-0 save at the end, call "
                        "torch.distributed.barrier() on every rank before "
                        "they exit") from error
            if found:
                momentum[f"{name}[{e}]"] = out
            else:
                missing.append(f"{name}[{e}]")
    return momentum, missing, stacks


def saved_state(opt, checkpoint):
    """The "muonps" entry of opt.state_dict(checkpoint), and the
    per-parameter state torch's format has (muonps/optimizer.py puts it
    under "state"): the next step id, AdamW moments and step count, and the
    momentum of every matrix, from its owner, whichever worker that is (or,
    with checkpoint, a reference to the workers' checkpoint of the last
    step). Matrices whose owner it cannot reach (another host's worker)
    and no checkpoint of the last step holds are left out, with a warning:
    loading the state where they are owned fails, naming them."""
    saved = {"step": opt._step_id, "adamw_step": 0, "adamw": {},
             "momentum": {}, "matrices": []}
    if opt._cuda is not None:
        opt._cuda.wait()
    for name, _, experts, _ in _matrices(opt):
        saved["matrices"] += [f"{name}[{e}]" for e in range(experts)]
    stacks = {}
    if checkpoint:
        saved["checkpoint"] = checkpoint_reference(opt)
    else:
        saved["momentum"], missing, stacks = gather_momentum(opt)
        if missing:
            reference = _checkpoint_of_last_step(opt)
            if reference is None:
                # Loading it where these are owned fails, naming them.
                warnings.warn(
                    f"muonps: this state_dict() lacks the momentum of "
                    f"{len(missing)} matrices ({_listed(missing)}): their "
                    "workers are not this host's, or the ranks did not "
                    "start under torch.distributed. Save each rank's "
                    "state_dict() (or use torch.distributed.checkpoint), or "
                    "give the job checkpoint_dir= and checkpoint_every= so "
                    "that a saved state references the workers' checkpoint "
                    "of its step")
            else:
                saved["checkpoint"] = reference
                saved["checkpointed"] = missing  # in the checkpoint
    per_param = {}
    for name, buf in stacks.items():
        if all(f"{name}[{e}]" in saved["momentum"]
               for e in range(buf.shape[0] if buf.dim() == 3 else 1)):
            per_param[name] = {"momentum_buffer": buf}
    if opt._cuda is not None:
        if opt._cuda.adamw is not None:
            saved["adamw_torch"] = opt._cuda.adamw.state_dict()
            inner = opt._cuda.adamw.optimizer.state
            for name, p, _ in opt._cuda.others:
                if p in inner:
                    per_param[name] = dict(inner[p])
        return saved, per_param
    for t in opt._lent:
        if t.muon:
            continue
        # This rank's moments (of its shard, for a DTensor), without
        # the lent padding.
        m = torch.empty(t.lent_elements, dtype=torch.float32)
        v = torch.empty(t.lent_elements, dtype=torch.float32)
        saved["adamw_step"] = opt._client.get_adamw(t.name, m, v)
        n = torch.Size(t.local_shape).numel()
        saved["adamw"][t.name] = {
            "exp_avg": m[:n].view(t.local_shape).clone(),
            "exp_avg_sq": v[:n].view(t.local_shape).clone()}
        per_param[t.name] = dict(saved["adamw"][t.name], step=torch.tensor(
            float(saved["adamw_step"])))
    return saved, per_param


def _checkpoint_of_last_step(opt):
    """checkpoint_reference(opt) when the job checkpoints and this rank's
    worker wrote the last step's (every owner then wrote it); else None."""
    if not opt._connection["checkpoint_dir"] or opt._step_id < 1:
        return None
    if opt._client.last_checkpoint_step() != opt._step_id - 1:
        return None
    return checkpoint_reference(opt)


def from_per_param(opt, state):
    """The "muonps" entry rebuilt from torch-format per-parameter state
    (what torch.distributed.checkpoint's get_optimizer_state_dict keeps of
    state_dict(): {index: {...}}); None when it holds no muonps state."""
    names = [opt._names[p] for g in opt.param_groups for p in g["params"]]
    by_name = {}
    for index, entry in state.items():
        if isinstance(index, int) and 0 <= index < len(names):
            by_name[names[index]] = entry
    steps = [int(e["muonps_step"]) for e in by_name.values()
             if "muonps_step" in e]
    if not steps:
        return None
    saved = {"step": max(steps), "adamw_step": 0, "adamw": {},
             "momentum": {}, "matrices": []}
    for name, p, experts, _ in _matrices(opt):
        saved["matrices"] += [f"{name}[{e}]" for e in range(experts)]
        entry = by_name.get(name, {})
        if "momentum_buffer" in entry:
            buf = entry["momentum_buffer"]
            for e in range(experts):
                saved["momentum"][f"{name}[{e}]"] = (
                    buf[e] if p.dim() == 3 else buf)
        if "muonps_checkpoint_dir" in entry:
            saved["checkpoint"] = {"dir": entry["muonps_checkpoint_dir"],
                                   "step": int(entry["muonps_checkpoint_step"])}
    if "checkpoint" in saved:
        saved["checkpointed"] = [k for k in saved["matrices"]
                                 if k not in saved["momentum"]]
    if opt._cuda is not None:
        saved["adamw_per_param"] = {
            name: by_name[name] for name, _, _ in opt._cuda.others
            if name in by_name and "exp_avg" in by_name[name]}
        return saved
    for t in opt._lent:
        entry = by_name.get(t.name, {})
        if not t.muon and "exp_avg" in entry:
            saved["adamw"][t.name] = {"exp_avg": entry["exp_avg"],
                                      "exp_avg_sq": entry["exp_avg_sq"]}
            saved["adamw_step"] = int(float(entry["step"]))
    return saved


def check_complete(opt, saved, allow_reset):
    """Raises naming the matrices this rank's worker owns whose momentum
    `saved` lacks (neither held nor in the checkpoint it references),
    unless `allow_reset`: then they restart from zero momentum, with a
    warning. Returns them."""
    if "checkpoint" in saved and "checkpointed" not in saved:
        return []  # every matrix from the checkpoint
    covered = set(saved["momentum"]) | set(saved.get("checkpointed", ()))
    missing = []
    for name, _, experts, shape in _matrices(opt):
        scratch = torch.empty(shape, dtype=torch.float32)
        for e in range(experts):
            key = f"{name}[{e}]"
            if key not in covered and opt._client.get_momentum(name, e,
                                                               scratch):
                missing.append(key)  # owned here
    if not missing:
        return []
    if not allow_reset:
        raise ValueError(
            f"muonps.Muon: the state has no momentum of {len(missing)} "
            f"matrices this rank's worker owns ({_listed(missing)}): it was "
            "saved on a rank that could not read them (another host's "
            "worker, or a muonps that saved only its own worker's), or for "
            "another model. Load a state holding them, or pass "
            "load_state_dict(..., allow_momentum_reset=True) (or "
            "muonps.Muon(allow_momentum_reset=True)) to start them from zero")
    warnings.warn(f"muonps: {len(missing)} matrices start from zero "
                  f"momentum: the loaded state has none of "
                  f"{_listed(missing)}")
    return missing


def _listed(keys, limit=8):
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit
                    else "")


def restore_state(opt, saved, reset=()):
    """Restores what saved_state gave: the step id, AdamW state, and the
    momentum of the matrices this rank's worker owns (the others' owners
    restore theirs on their ranks; `reset` ones start from zero), or, for
    a checkpoint reference, the worker restores them from the
    checkpoint."""
    zeros = {}
    for key in reset:
        match = re.fullmatch(r"(.*)\[(\d+)\]", key)
        shape = dict((n, s) for n, _, _, s in _matrices(opt))[match[1]]
        if shape not in zeros:
            zeros[shape] = torch.zeros(shape, dtype=torch.float32)
        saved["momentum"][key] = zeros[shape]
    if opt._cuda is not None:
        opt._cuda.wait()
        if "checkpoint" in saved:
            opt._client.restore_checkpoint(saved["checkpoint"]["dir"],
                                           int(saved["checkpoint"]["step"]))
        if "adamw_torch" in saved and opt._cuda.adamw is not None:
            opt._cuda.adamw.load_state_dict(saved["adamw_torch"])
        elif saved.get("adamw_per_param") and opt._cuda.adamw is not None:
            inner = opt._cuda.adamw.optimizer.state
            for name, p, _ in opt._cuda.others:
                entry = saved["adamw_per_param"].get(name)
                if entry is not None:
                    inner[p] = {k: (v.to(p.device) if k != "step" or
                                    v.device.type != "cpu" else v.clone())
                                for k, v in entry.items()
                                if k in ("step", "exp_avg", "exp_avg_sq")}
        names = {name for name, _, _ in opt._cuda.matrices}
        for key, values in saved["momentum"].items():
            match = re.fullmatch(r"(.*)\[(\d+)\]", key)
            if not match or match[1] not in names:
                raise ValueError(f"muonps.Muon: the state has momentum "
                                 f"{key!r}, not a matrix here")
            opt._client.set_momentum(match[1], int(match[2]),
                                     _f32(values))
        opt._step_id = int(saved["step"])
        return
    if "checkpoint" in saved:
        opt._client.restore_checkpoint(saved["checkpoint"]["dir"],
                                       int(saved["checkpoint"]["step"]))
    lent = {t.name: t for t in opt._lent}
    for name, moments in saved["adamw"].items():
        if name not in lent or lent[name].muon:
            raise ValueError(f"muonps.Muon: the state has AdamW moments "
                             f"of {name!r}, not an AdamW parameter here")
        t = lent[name]
        opt._client.set_adamw(name, _padded(moments["exp_avg"], t),
                              _padded(moments["exp_avg_sq"], t),
                              int(saved["adamw_step"]))
    for key, values in saved["momentum"].items():
        match = re.fullmatch(r"(.*)\[(\d+)\]", key)
        if not match or match[1] not in lent or not lent[match[1]].muon:
            raise ValueError(f"muonps.Muon: the state has momentum "
                             f"{key!r}, not a matrix here")
        opt._client.set_momentum(match[1], int(match[2]), _f32(values))
    # AdamW state as of the checkpoint: its steps are not stepped again.
    opt._client.set_last_adamw_step(int(saved["step"]) - 1)
    opt._step_id = int(saved["step"])
    opt._failed_step = None


def _padded(moments, t):
    """A tensor's saved moments as the client lends them: flat fp32, zero
    padding after a DTensor's shard (raises naming it when the saved shard
    is not this rank's)."""
    flat = _f32(moments).flatten()
    if tuple(moments.shape) != tuple(t.local_shape):
        raise ValueError(f"muonps.Muon: the state's AdamW moments of "
                         f"{t.name!r} are {tuple(moments.shape)}; this rank "
                         f"holds {tuple(t.local_shape)}")
    out = torch.zeros(t.lent_elements, dtype=torch.float32)
    out[:flat.numel()] = flat
    return out


def _f32(tensor):
    """`tensor` as contiguous fp32 on the host (what the client copies)."""
    return tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
