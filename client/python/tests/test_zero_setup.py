"""Zero setup: muonps.Muon with no coordinator starts its own.

With no `coordinator=` and no $MUONPS_COORDINATOR, one rank's optimizer
starts a private coordinator and worker as its children (muonps/_service.py),
steps on the same trajectory as against a service started by hand, and
leaves no process behind: not after close(), not after the script exits,
and not after it is killed with SIGKILL (the children die with it).
"""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import muonps
import toy
from conftest import PACKAGE_ROOT
from muonps import _service
from test_trajectory import STEPS, check_trajectory



def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of this process counts as gone.
    status = pathlib.Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def wait_gone(pids, seconds=15):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_no_coordinator_starts_a_private_service_on_the_same_trajectory(
        private):
    init, grads = toy.initial(seed=11), toy.gradients(STEPS, seed=12)
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), lr=0.02, weight_decay=0.1,
                      adamw_lr=0.01, adamw_weight_decay=0.01)
    pids = opt._service.pids
    assert len(pids) == 2 and all(map(alive, pids))

    def hyper(step, name):
        return (0.02, 0.1) if name in toy.MATRICES else (0.01, 0.01)

    check_trajectory(opt, params, init, grads, hyper)
    opt.close()
    assert wait_gone(pids) == [], "children left after close()"


def test_children_die_with_a_killed_script(private, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(PACKAGE_ROOT)!r})
        import torch, muonps
        w = torch.nn.Parameter(torch.randn(8, 4))
        opt = muonps.Muon([w], lr=0.02)
        w.grad = torch.ones_like(w)
        opt.step()
        print("PIDS", *opt._service.pids, flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), 9)
        """))
    for how in ("exit", "kill"):
        run = subprocess.run([sys.executable, str(script), how],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ))
        line = [l for l in run.stdout.splitlines() if l.startswith("PIDS")]
        assert line, f"{how}: {run.stdout}\n{run.stderr}"
        pids = [int(p) for p in line[0].split()[1:]]
        if how == "kill":
            assert run.returncode == -signal.SIGKILL
        else:
            assert run.returncode == 0, run.stderr
        assert wait_gone(pids) == [], f"children outlived the script ({how})"


def test_several_ranks_need_a_shared_service(private):
    w = toy.parameters(toy.initial())["w_tall"]
    with pytest.raises(ValueError, match="MUONPS_COORDINATOR"):
        muonps.Muon([w], lr=0.02, rank=0, world_size=2)


def test_missing_binaries_name_the_command_that_builds_them(monkeypatch,
                                                            tmp_path):
    monkeypatch.setattr(_service, "binary_candidates",
                        lambda name, environ=None: [tmp_path / name])
    with pytest.raises(_service.ServiceError) as raised:
        _service.LocalService()
    message = str(raised.value)
    assert str(tmp_path / "muonps-coordinator") in message
    assert "bazel build //server/coordinator:muonps-coordinator" in message
    assert "MUONPS_COORDINATOR" in message
