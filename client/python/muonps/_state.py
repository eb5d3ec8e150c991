"""muonps.Muon's state_dict and load_state_dict beyond torch's own: the
step id, AdamW state and the workers' momentum, copied through the client or
referenced in the workers' checkpoints (muonps/optimizer.py calls these)."""

import os
import re
import time

import torch


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


def saved_state(opt, checkpoint):
    """The "muonps" entry of opt.state_dict(checkpoint): the next step id,
    AdamW moments and step count, and the momentum of the matrices this
    rank's worker owns (or, with checkpoint, a reference to the workers'
    checkpoint of the last step)."""
    saved = {"step": opt._step_id, "adamw_step": 0, "adamw": {},
             "momentum": {}}
    if opt._cuda is not None:
        opt._cuda.wait()
    if checkpoint:
        saved["checkpoint"] = checkpoint_reference(opt)
    if opt._cuda is not None:
        for name, p, _ in opt._cuda.matrices:
            experts = p.shape[0] if p.dim() == 3 else 1
            for e in range(experts):
                buf = torch.empty(p.shape[-2:], dtype=torch.float32)
                if (not checkpoint and
                        opt._client.get_momentum(name, e, buf)):
                    saved["momentum"][f"{name}[{e}]"] = buf
        if opt._cuda.adamw is not None:
            saved["adamw_torch"] = opt._cuda.adamw.state_dict()
    for t in opt._lent:
        if t.muon:
            if checkpoint:
                continue  # on disk, named by saved["checkpoint"]
            for e in range(t.experts):
                buf = torch.empty(t.shape[-2:], dtype=torch.float32)
                if opt._client.get_momentum(t.name, e, buf):
                    saved["momentum"][f"{t.name}[{e}]"] = buf
        else:
            # This rank's moments (of its shard, for a DTensor), without
            # the lent padding.
            m = torch.empty(t.lent_elements, dtype=torch.float32)
            v = torch.empty(t.lent_elements, dtype=torch.float32)
            saved["adamw_step"] = opt._client.get_adamw(t.name, m, v)
            n = torch.Size(t.local_shape).numel()
            saved["adamw"][t.name] = {
                "exp_avg": m[:n].view(t.local_shape).clone(),
                "exp_avg_sq": v[:n].view(t.local_shape).clone()}
    return saved


def restore_state(opt, saved):
    """Restores what saved_state gave: the step id, AdamW state, and the
    momentum of the matrices this rank's worker owns (or, for a checkpoint
    reference, the worker restores it from the checkpoint)."""
    if opt._cuda is not None:
        opt._cuda.wait()
        if "checkpoint" in saved:
            opt._client.restore_checkpoint(saved["checkpoint"]["dir"],
                                           int(saved["checkpoint"]["step"]))
        if "adamw_torch" in saved and opt._cuda.adamw is not None:
            opt._cuda.adamw.load_state_dict(saved["adamw_torch"])
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
