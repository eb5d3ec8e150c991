"""examples/ddp_gpt.py, a GPT trainer written as such scripts are (tied
embeddings, lr written into param_groups, clip_grad_norm_, no_sync
accumulation, a rank-0 checkpoint), on two gloo CPU ranks: muonps.Muon gives
the loss of the same split without muonps (torch.optim.Muon + AdamW, or
reference.py's Muon where torch has no Muon), and a resume from rank 0's
checkpoint is bit-identical to the uninterrupted run. Also the routing it
prints, and loading a state that lacks momentum."""

import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from conftest import PACKAGE_ROOT

SCRIPT = PACKAGE_ROOT.parents[1] / "examples" / "ddp_gpt.py"


def _run(tmp_path, out, *extra):
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    run = subprocess.run([sys.executable, str(SCRIPT), "--cpu_ranks", "2",
                          "--out", str(out), *extra], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return [json.loads(line)["loss"] for line in out.read_text().splitlines()]


def test_two_cpu_ranks_match_the_split_without_muonps_and_resume_exactly(
        private, tmp_path):
    whole = _run(tmp_path, tmp_path / "a.jsonl", "--save_every", "6",
                 "--checkpoint", str(tmp_path / "ckpt{iter}.pt"))
    ckpt = tmp_path / "ckpt5.pt"
    resumed = _run(tmp_path, tmp_path / "b.jsonl", "--resume", str(ckpt))
    baseline = _run(tmp_path, tmp_path / "c.jsonl", "--optimizer", "torch")
    assert len(whole) == 12 and len(resumed) == 6
    assert resumed == whole[6:]  # bit-identical
    # Another seed moves the final loss by ~0.06; muonps stays far closer.
    assert abs(whole[-1] - baseline[-1]) < 5e-3, (whole, baseline)
    assert whole[-1] < whole[0]
    # Rank 0's checkpoint holds both workers' momentum: every matrix.
    state = torch.load(ckpt)["optimizer"]["muonps"]
    assert sorted(state["momentum"]) == sorted(state["matrices"])
    assert len(state["matrices"]) == 8


def _example():
    spec = importlib.util.spec_from_file_location("ddp_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_routing_follows_the_model_and_a_state_lacking_momentum_is_refused(
        private, caplog):
    import muonps
    ddp_gpt = _example()
    torch.manual_seed(0)
    model = ddp_gpt.GPT(64, 16, 64, 4, 1)  # width == vocab: not a head
    with caplog.at_level(logging.INFO, logger="muonps"):
        opt = muonps.Muon(model.named_parameters(), lr=0.01)
    line = opt.describe()
    assert line in caplog.text
    assert "Muon 4 tensors" in line, line
    assert "wte.weight (embedding, tied to lm_head.weight)" in line, line
    assert "wpe.weight (embedding)" in line, line
    tokens = torch.randint(64, (4, 17))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    opt.step()
    state = opt.state_dict()
    per_param = [e for e in state["state"].values() if "momentum_buffer" in e]
    assert len(per_param) == 4  # torch's format too
    del state["muonps"]["momentum"]["h.0.c_fc.weight[0]"]
    with pytest.raises(ValueError, match=r"'h\.0\.c_fc\.weight\[0\]'"):
        opt.load_state_dict(state)
    with pytest.warns(UserWarning, match="zero momentum"):
        opt.load_state_dict(state, allow_momentum_reset=True)
    opt.close()

    seq = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 1))
    opt = muonps.Muon(seq, lr=0.01)
    assert "2.weight (output head)" in opt.describe()
    assert "Muon 1 tensors" in opt.describe()
    opt.close()


def _has_dcp():
    try:
        from torch.distributed.checkpoint.state_dict import (  # noqa: F401
            get_optimizer_state_dict, set_optimizer_state_dict)
    except Exception:  # torch 1.13 (Debian's)
        return False
    return True


@pytest.mark.skipif(not _has_dcp(), reason="needs torch >= 2.2")
def test_distributed_checkpoint_state_dict_round_trip(private):
    """get_optimizer_state_dict keeps torch's per-parameter state (muonps's
    momentum under the parameters' names) and fakes no step;
    set_optimizer_state_dict restores it."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict, set_optimizer_state_dict)
    import muonps
    torch.manual_seed(0)
    model = _example().GPT(64, 16, 32, 4, 1)
    opt = muonps.Muon(model, lr=0.01)
    tokens = torch.randint(64, (4, 17))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    opt.step()
    opt.zero_grad()
    state = get_optimizer_state_dict(model, opt)
    buf = state["state"]["h.0.c_fc.weight"]["momentum_buffer"]
    assert buf.shape == (128, 32) and buf.abs().sum() > 0
    assert opt.step_id == 1
    set_optimizer_state_dict(model, opt, state)
    assert opt.step_id == 1
    again = opt.state_dict()["muonps"]["momentum"]["h.0.c_fc.weight[0]"]
    assert torch.equal(again, buf)
    opt.close()
