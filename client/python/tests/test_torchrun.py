"""torchrun: a script written for `torchrun --nproc_per_node 2` works with
muonps.Muon and no service started by hand, launched by torchrun itself
(rank 0 starts the coordinator and tells the others through
torch.distributed; every rank starts its own worker) or by
`python -m muonps.run` (the launcher starts the coordinator). Both ranks
follow torch.optim.Muon's formula (reference.py) and AdamW, as on one worker.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import PACKAGE_ROOT

TESTS = PACKAGE_ROOT / "tests"

SCRIPT = textwrap.dedent(f"""
    import sys
    sys.path[:0] = [{str(PACKAGE_ROOT)!r}, {str(TESTS)!r}]
    import torch, torch.distributed as dist
    import muonps, toy
    from reference import relative_error
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    init, grads = toy.initial(seed=21), toy.gradients(5, seed=22)
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), lr=0.02, weight_decay=0.1,
                      adamw_lr=0.01, adamw_weight_decay=0.01)
    hyper = lambda step, name: ((0.02, 0.1) if name in toy.MATRICES
                                else (0.01, 0.01))
    ref = toy.reference_trajectory(init, grads, torch.float64, hyper)
    worst = 0.0
    for step, g in enumerate(grads):
        toy.set_grads(params, g)  # replicated: every rank the same gradient
        opt.step()
        for n, p in params.items():
            worst = max(worst, relative_error(p, ref[step][n]))
    opt.close()
    dist.barrier()
    print(f"RANK {{rank}} WORLD {{dist.get_world_size()}} ERR {{worst:.3e}}",
          flush=True)
    assert worst <= 1e-5, worst
    """)


def torchrun_works():
    """Debian's torch 1.13 on Python 3.11 ships a torchrun that fails before
    starting anything (Std.from_str returns None); torch 2.x's works."""
    try:
        from torch.distributed.elastic.multiprocessing.api import Std
    except ImportError:
        return False
    return Std.from_str("0") is not None


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("launcher", ["env", "torchrun", "muonps.run"])
def test_two_ranks_start_their_own_service(private, tmp_path, launcher):
    """"env": the two ranks started as torchrun starts them (RANK,
    WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK), where torchrun itself does
    not work."""
    if launcher != "env" and not torchrun_works():
        pytest.skip("this torch's torchrun is broken (Debian's 1.13 on "
                    "Python 3.11); the GPU machine's torch 2.11 runs it")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    if launcher == "env":
        port = str(free_port())
        ranks = [subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                     LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=port)) for r in range(2)]
        outputs = [p.communicate(timeout=300)[0] for p in ranks]
        for p, out in zip(ranks, outputs):
            assert p.returncode == 0, out
        stdout = "".join(outputs)
    else:
        module = ("torch.distributed.run" if launcher == "torchrun"
                  else "muonps.run")
        run = subprocess.run(
            [sys.executable, "-m", module, "--standalone", "--nproc_per_node",
             "2", str(script)], capture_output=True, text=True, timeout=300,
            env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        stdout = run.stdout
    # The two ranks share torchrun's stdout: their lines may run together.
    found = sorted(re.findall(r"RANK (\d+) WORLD (\d+) ERR", stdout))
    assert found == [("0", "2"), ("1", "2")], stdout
