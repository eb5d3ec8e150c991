"""What a user sees when something is missing: the unreachable coordinator
or worker (by address, with what to start), a job with fewer workers than
trainers (after start waited for them), a library that cannot be found
or exports nothing, and arguments the C ABI cannot honour (a gradient
marked ready on a CPU client among them)."""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import warnings

import pytest
import torch

import muonps
from muonps import _native


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model():
    return [("w", torch.nn.Parameter(torch.randn(8, 4))),
            ("b", torch.nn.Parameter(torch.randn(4)))]


def test_unreachable_coordinator_error_names_the_address_and_what_to_start(
        tmp_path):
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError) as raised:
        muonps.Muon(model(), coordinator=address, job="nobody",
                    worker_socket=str(tmp_path / "w.sock"), timeout=5)
    message = str(raised.value)
    assert f"no muonps coordinator listens at {address}" in message
    assert f"muonps-coordinator --host 127.0.0.1 --port {address[10:]}" in message
    # test_hints.py runs the command it prints.


def test_unreachable_worker_error_names_the_socket_and_what_to_start(cluster):
    c = cluster(workers=0)
    path = f"{c.socket_dir}/absent.sock"
    begin = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        muonps.Muon(model(), coordinator=c.coordinator, job=c.job,
                    worker_socket=path, timeout=1.5)
    assert time.monotonic() - begin < 30
    message = str(raised.value)
    assert f"no muonps worker at unix:{path}" in message
    assert (f"muonps-worker --coordinator {c.coordinator} --job {c.job} "
            f"--socket {path}") in message


def test_worker_of_another_job_error_says_it_has_no_plan_for_this_job(cluster):
    c = cluster()
    with pytest.raises(RuntimeError, match="has no plan for job 'other-job'"):
        muonps.Muon(model(), coordinator=c.coordinator, job="other-job",
                    worker_socket=c.sockets[0], timeout=1.5)


def test_start_without_a_worker_per_trainer_waits_then_names_the_counts(
        cluster):
    c = cluster()  # one worker for a job of two trainers
    params = model()
    begin = time.monotonic()
    with pytest.raises(muonps.MuonpsError, match=r"has 1 worker\(s\) for 2 "
                       r"trainers .*start one worker per trainer rank"):
        muonps.Muon(params, timeout=1.5, **c.options(rank=0, world_size=2))
    assert 1.5 <= time.monotonic() - begin < 30


def test_missing_library_error_lists_every_path_and_the_bazel_command(tmp_path):
    # A copy of the package outside the repository, run from elsewhere, so
    # no candidate path exists.
    shutil.copytree(pathlib.Path(muonps.__file__).parent, tmp_path / "muonps",
                    ignore=shutil.ignore_patterns("lib", "__pycache__"))
    absent = tmp_path / "nowhere" / "libmuonps.so"
    script = ("import muonps._native as n\n"
              "try:\n    n.load_library()\n"
              "except n.LibraryNotFoundError as e:\n    print(e)\n")
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
        text=True, env=dict(os.environ, MUONPS_LIB=str(absent),
                            PYTHONPATH=str(tmp_path)), check=True).stdout
    assert f"{absent} (absent)" in out
    assert f"{tmp_path / 'muonps' / 'lib' / 'libmuonps.so'} (absent)" in out
    assert "bazel build //client:libmuonps.so" in out


def test_library_without_the_c_abi_is_reported_with_the_fix():
    libz = pathlib.Path("/lib/x86_64-linux-gnu/libz.so.1")
    if not libz.is_file():
        pytest.skip("no libz to stand in for an empty library")
    with pytest.raises(_native.LibraryNotFoundError, match="alwayslink"):
        _native.load_library(environ={"MUONPS_LIB": str(libz)})


def test_gradient_ready_on_a_cpu_client_is_refused_naming_the_matrix():
    # A host client's step orders its gradients: no matrix has an event of
    # its own (the check needs no service and no GPU).
    client = _native.NativeClient("127.0.0.1:1", "job",
                                  "/tmp/muonps-none.sock", 0, 1, 1)
    try:
        client.add_matrix("w", 4, 8, 1, _native.LAYOUT_REPLICATED, 0)
        with pytest.raises(_native.MuonpsError, match='matrix "w"') as raised:
            client.gradient_ready("w", 0)
        assert raised.value.code == _native.FAILED_PRECONDITION
    finally:
        client.close()


@pytest.mark.parametrize("kwargs, what", [
    (dict(ns_algorithm="svd"), "ns_algorithm"),
    (dict(ns_coefficients=(3.0, -3.0)), "ns_coefficients"),
    (dict(ns_coefficients=(3.0, float("nan"), 1.0)), "ns_coefficients"),
    (dict(eps=0.0), "eps"),
    (dict(layout="row_sharded"), "layout"),
    (dict(lr=-1.0), "lr"),
    (dict(adjust_lr_fn="sqrt"), "adjust_lr_fn"),
])
def test_arguments_the_service_cannot_honour_are_refused_up_front(kwargs, what):
    with pytest.raises((ValueError, NotImplementedError), match=what):
        muonps.Muon(model(), **kwargs)


def test_groups_that_differ_in_a_job_hyperparameter_are_refused(cluster):
    c = cluster()
    w, b = model()
    groups = [{"params": [w]}, {"params": [b], "momentum": 0.9}]
    with pytest.raises(ValueError, match="'momentum'"):
        muonps.Muon(groups, **c.options())


def test_a_bad_adamw_lr_is_refused_before_anything_is_applied(cluster):
    # AdamW's lr is checked before the workers step: nothing changes, the
    # step id is not used up, and a good lr then steps normally.
    c = cluster()
    params = dict(model())
    opt = muonps.Muon(list(params.items()), lr=0.02, **c.options())
    for p in params.values():
        p.grad = torch.ones_like(p)
    before = {n: p.detach().clone() for n, p in params.items()}
    opt.param_groups[0]["adamw_lr"] = float("inf")
    with pytest.raises(muonps.MuonpsError, match="adamw_lr"):
        opt.step()
    for n, p in params.items():
        assert torch.equal(p.detach(), before[n]), n
    opt.param_groups[0]["adamw_lr"] = 0.01
    opt.step()
    assert opt.step_id == 1
    opt.close()


def test_a_committed_step_sent_again_applies_nothing_twice(cluster):
    # A retry of a committed step id (its first answer lost, say) is
    # already applied on the workers, and AdamW, which the client ran on the
    # first answer, does not run again: once per committed step id.
    c = cluster()
    params = dict(model())
    opt = muonps.Muon(list(params.items()), lr=0.02, **c.options())
    for p in params.values():
        p.grad = torch.ones_like(p)
    opt.step()
    after = {n: p.detach().clone() for n, p in params.items()}
    outcome = opt._client.step(0, [(0.02, 0.0, 0.01, 0.0)])
    assert outcome.already_applied and not outcome.adamw_applied
    assert outcome.momentum_reset == 0
    for n, p in params.items():
        assert torch.equal(p.detach(), after[n]), n
    opt.close()


def test_a_parameter_without_a_gradient_is_named_once(cluster):
    # torch's optimizers leave a parameter with no gradient alone; the job
    # steps it with zeros. Said once per parameter, never for the others.
    c = cluster()
    params = dict(model())
    opt = muonps.Muon(list(params.items()), lr=0.02, **c.options())
    for step in range(2):
        params["w"].grad = torch.ones_like(params["w"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        said = [str(w.message) for w in caught
                if "has no gradient" in str(w.message)]
        if step == 0:
            assert len(said) == 1, said
            assert said[0].startswith("muonps.Muon: 'b' has no gradient")
            assert "leave it out of the optimizer" in said[0]
        else:
            assert said == []
    opt.close()


def test_the_workers_socket_is_private_to_its_user(cluster):
    # The socket leads to the trainer's buffers: mode 0600, so only the
    # worker's user can connect (a Unix socket needs write permission).
    c = cluster()
    mode = os.stat(c.sockets[0]).st_mode & 0o777
    assert mode == 0o600, oct(mode)
