"""state_dict() / load_state_dict(): resuming equals not stopping.

A run saved after step 3 and loaded into a fresh optimizer (a fresh client,
on the same cluster or on a fresh one whose worker holds no momentum)
reaches the parameters of an uninterrupted run at step 6 within 1e-6
relative (the same fp32 kernels see the same inputs; only the checkpoint's
round trip is in between). With two workers each rank's state holds the
momentum its own worker owns.
"""

import concurrent.futures
import io

import pytest
import torch

import muonps
import toy
from muonps import _native
from reference import ReferenceMuon, relative_error

HYPER = dict(lr=0.02, weight_decay=0.1, adamw_lr=0.01, adamw_weight_decay=0.01)
RESUME_TOLERANCE = 1e-6


def run(opt, params, grads):
    for g in grads:
        toy.set_grads(params, g)
        opt.step()


def snapshot(params):
    return {n: p.detach().clone() for n, p in params.items()}


def through_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("resume_on", ["same_cluster", "fresh_cluster"])
def test_state_dict_saved_at_step_3_resumes_to_uninterrupted_params_at_step_6(
        cluster, resume_on):
    init, grads = toy.initial(seed=8), toy.gradients(6, seed=9)
    uninterrupted = toy.parameters(init)
    whole = cluster()
    opt = muonps.Muon(list(uninterrupted.items()), **HYPER, **whole.options())
    run(opt, uninterrupted, grads)
    opt.close()

    first = cluster()
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), **HYPER, **first.options())
    run(opt, params, grads[:3])
    state, values = through_file(opt.state_dict()), snapshot(params)
    assert state["muonps"]["step"] == 3
    assert sorted(state["muonps"]["momentum"]) == [
        "experts[0]", "experts[1]", "experts[2]", "experts[3]", "w_tall[0]",
        "w_wide[0]"]
    assert state["muonps"]["adamw_step"] == 3
    opt.close()

    second = first if resume_on == "same_cluster" else cluster()
    resumed = toy.parameters(values)
    opt = muonps.Muon(list(resumed.items()), **HYPER, **second.options())
    opt.load_state_dict(state)
    assert opt.step_id == 3
    run(opt, resumed, grads[3:])
    opt.close()
    for n in init:
        error = relative_error(resumed[n], uninterrupted[n])
        assert error <= RESUME_TOLERANCE, f"{n}: {error:.2e} after step 6"

    if resume_on == "fresh_cluster":
        # Control: without the state, a fresh worker's momentum starts at zero
        # and the run ends elsewhere; the comparison above can tell.
        control = toy.parameters(values)
        opt = muonps.Muon(list(control.items()), **HYPER, **cluster().options())
        run(opt, control, grads[3:])
        opt.close()
        assert relative_error(control["w_tall"], uninterrupted["w_tall"]) > 1e-3


def test_the_same_script_run_again_on_the_same_job_starts_a_new_run(
        cluster, recwarn):
    # The quick start run twice against one running service: the second
    # optimizer's step 0 was applied by the first run. It starts a new run
    # (momentum from zero, step ids after the workers' last) and lands
    # where the first run did, as a fresh torch optimizer would.
    c = cluster()
    grads = toy.gradients(3)
    first = toy.parameters(toy.initial())
    opt = muonps.Muon(list(first.items()), **HYPER, **c.options())
    run(opt, first, grads)
    opt.close()
    again = toy.parameters(toy.initial())
    opt = muonps.Muon(list(again.items()), **HYPER, **c.options())
    run(opt, again, grads)
    assert opt.step_id >= 6  # ids 3..5 or later: the job's went up to 2
    state = opt.state_dict()
    opt.close()
    for n in first:
        assert relative_error(again[n], first[n]) <= RESUME_TOLERANCE, n
    messages = [str(w.message) for w in recwarn
                if "starts a new run" in str(w.message)]
    assert len(messages) == 1 and "reset to zero" in messages[0]
    # A third run resumes the second from its state instead (no new run).
    resumed = toy.parameters({n: p.detach() for n, p in again.items()})
    opt = muonps.Muon(list(resumed.items()), **HYPER, **c.options())
    opt.load_state_dict(state)
    run(opt, resumed, grads[:1])
    opt.close()
    assert len([w for w in recwarn if "starts a new run" in str(w.message)]) == 1


def test_a_new_run_also_starts_where_steps_are_answered_already_applied(
        cluster, monkeypatch):
    # A client library that answers a step the workers had applied before
    # with already_applied (and nothing applied), naming no last step: the
    # new run finds the first free id by doubling the offset.
    c = cluster()
    grads = toy.gradients(3)
    first = toy.parameters(toy.initial())
    opt = muonps.Muon(list(first.items()), **HYPER, **c.options())
    run(opt, first, grads)
    opt.close()
    step = _native.NativeClient.step

    def answering_already_applied(self, step_id, *args, **kwargs):
        try:
            return step(self, step_id, *args, **kwargs)
        except _native.MuonpsError as e:
            if "had already applied step" not in str(e):
                raise
            return _native.StepOutcome(False, True, False, 0)

    monkeypatch.setattr(_native.NativeClient, "step",
                        answering_already_applied)
    again = toy.parameters(toy.initial())
    opt = muonps.Muon(list(again.items()), **HYPER, **c.options())
    with pytest.warns(UserWarning, match="starts a new run"):
        run(opt, again, grads)
    assert opt.step_id == 7  # 0, 1 and 2 applied before: 4, 5, 6
    opt.close()
    for n in first:
        assert relative_error(again[n], first[n]) <= RESUME_TOLERANCE, n


def test_a_loaded_state_behind_the_workers_goes_on_from_it(cluster, recwarn):
    # A run saved at step 3 went on to step 6; its state of step 3, loaded
    # by a new process on the same job, goes on from step 3's momentum and
    # AdamW moments (under step ids the workers have not used) and lands
    # where the first run did after step 6.
    c = cluster()
    init, grads = toy.initial(seed=3), toy.gradients(6, seed=4)
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), **HYPER, **c.options())
    run(opt, params, grads[:3])
    state, values = through_file(opt.state_dict()), snapshot(params)
    run(opt, params, grads[3:])
    opt.close()
    resumed = toy.parameters(values)
    opt = muonps.Muon(list(resumed.items()), **HYPER, **c.options())
    opt.load_state_dict(state)
    run(opt, resumed, grads[3:])
    assert opt.step_id > 8
    opt.close()
    for n in init:
        error = relative_error(resumed[n], params[n])
        assert error <= RESUME_TOLERANCE, f"{n}: {error:.2e}"
    assert any("goes on from the loaded state" in str(w.message)
               for w in recwarn)


def test_a_new_run_on_a_job_with_dedicated_workers_says_what_to_do(cluster):
    # Dedicated workers hold momentum of the earlier run that this
    # optimizer cannot reset: the step says so, and what to do instead.
    c = cluster(dedicated=1)
    grads = toy.gradients(1)
    params = toy.parameters(toy.initial())
    opt = muonps.Muon(list(params.items()), **HYPER, **c.options())
    run(opt, params, grads)
    opt.close()
    again = toy.parameters(toy.initial())
    opt = muonps.Muon(list(again.items()), **HYPER, **c.options())
    toy.set_grads(again, grads[0])
    with pytest.raises(RuntimeError, match=r"already applied step 0.*"
                       r"dedicated worker\(s\).*Give each run its own job.*--job NAME"):
        opt.step()
    opt.close()


def two_ranks(fn):
    """Runs fn(rank) for ranks 0 and 1 at once (their steps meet on the
    workers); returns both results, re-raising either's exception."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(fn, rank) for rank in range(2)]
        return [f.result(timeout=120) for f in futures]


def test_each_ranks_state_holds_the_momentum_its_worker_owns(cluster):
    init, grads = toy.initial(seed=10), toy.gradients(4, seed=11)
    c = cluster(workers=2)

    def first_half(rank):
        params = toy.parameters(init)
        opt = muonps.Muon(list(params.items()), **HYPER, timeout=60,
                          **c.options(rank, 2))
        run(opt, params, grads[:2])
        state = opt.state_dict()
        opt.close()
        return state, snapshot(params)

    (state0, values0), (state1, values1) = two_ranks(first_half)
    owned = [set(s["muonps"]["momentum"]) for s in (state0, state1)]
    assert owned[0] and owned[1], "the plan should split the matrices"
    assert not owned[0] & owned[1]
    assert owned[0] | owned[1] == {"w_tall[0]", "w_wide[0]", "experts[0]",
                                   "experts[1]", "experts[2]", "experts[3]"}
    reference = ReferenceMuon()
    ref_params = {n: init[n].clone() for n in toy.MATRICES}
    for g in grads[:2]:
        for n in toy.MATRICES:
            reference.step(n, ref_params[n], g[n], HYPER["lr"],
                           HYPER["weight_decay"])
    for state in (state0, state1):
        for key, momentum in state["muonps"]["momentum"].items():
            assert relative_error(momentum, reference.buffers[key]) <= 1e-6, key

    # Every rank loads the merged state on a fresh cluster (fresh workers,
    # no momentum): each restores what its worker owns, skips the rest.
    merged = dict(state0)
    merged["muonps"] = dict(state0["muonps"], momentum={
        **state0["muonps"]["momentum"], **state1["muonps"]["momentum"]})
    fresh = cluster(workers=2)

    def second_half(rank):
        params = toy.parameters(values0 if rank == 0 else values1)
        opt = muonps.Muon(list(params.items()), **HYPER, timeout=60,
                          **fresh.options(rank, 2))
        opt.load_state_dict(merged)
        run(opt, params, grads[2:])
        opt.close()
        return snapshot(params)

    results = two_ranks(second_half)
    hyper = lambda step, n: ((HYPER["lr"], HYPER["weight_decay"])
                             if n in toy.MATRICES else
                             (HYPER["adamw_lr"], HYPER["adamw_weight_decay"]))
    expected = toy.reference_trajectory(init, grads, torch.float64, hyper)[-1]
    for rank, params in enumerate(results):
        for n in init:
            error = relative_error(params[n], expected[n])
            assert error <= 1e-5, f"rank {rank} {n}: {error:.2e}"


def test_momentum_of_a_large_matrix_survives_state_dict(cluster):
    # 1024 x 1024 floats are exactly gRPC's 4 MiB default message; with the
    # header, more. The worker's socket and the client's channels allow more.
    c = cluster()
    g = torch.Generator().manual_seed(31)
    w = torch.nn.Parameter(torch.randn(1024, 1024, generator=g) * 0.01)
    opt = muonps.Muon([("big", w)], lr=0.02, **c.options())
    w.grad = torch.randn(1024, 1024, generator=g)
    opt.step()
    state = through_file(opt.state_dict())
    momentum = state["muonps"]["momentum"]["big[0]"]
    assert momentum.shape == (1024, 1024)
    assert torch.count_nonzero(momentum) > 0
    opt.close()
    fresh = cluster()  # a worker that holds no momentum
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = muonps.Muon([("big", w2)], lr=0.02, **fresh.options())
    opt2.load_state_dict(state)
    again = opt2.state_dict()["muonps"]["momentum"]["big[0]"]
    assert torch.equal(again, momentum)
    opt2.close()


def test_state_dict_referencing_a_checkpoint_resumes_to_uninterrupted_params(
        cluster, tmp_path):
    init, grads = toy.initial(seed=8), toy.gradients(6, seed=9)
    uninterrupted = toy.parameters(init)
    opt = muonps.Muon(list(uninterrupted.items()), **HYPER,
                      **cluster().options())
    run(opt, uninterrupted, grads)
    opt.close()

    directory = tmp_path / "ckpt"
    params = toy.parameters(init)
    opt = muonps.Muon(list(params.items()), **HYPER, **cluster().options(),
                      checkpoint_dir=str(directory), checkpoint_every=5)
    run(opt, params, grads[:2])  # step ids 0 (checkpointed: 0 % 5) and 1
    assert opt.checkpoint() in (-1, 0)  # step 2 is checkpointed on request
    run(opt, params, grads[2:3])
    state = through_file(opt.state_dict(checkpoint=True))
    values = snapshot(params)
    assert state["muonps"]["momentum"] == {}
    assert state["muonps"]["checkpoint"] == {"dir": str(directory), "step": 2}
    assert (directory / "w0" / f"ckpt-{2:020d}.manifest").is_file()
    opt.close()

    # A fresh cluster whose job names no checkpoint_dir: load_state_dict
    # has its worker read the referenced checkpoint.
    resumed = toy.parameters(values)
    opt = muonps.Muon(list(resumed.items()), **HYPER, **cluster().options())
    opt.load_state_dict(state)
    assert opt.step_id == 3
    run(opt, resumed, grads[3:])
    opt.close()
    for n in init:
        error = relative_error(resumed[n], uninterrupted[n])
        assert error <= RESUME_TOLERANCE, f"{n}: {error:.2e} after step 6"


def test_state_dict_of_a_step_no_checkpoint_was_asked_for_raises(
        cluster, tmp_path):
    params = toy.parameters(toy.initial())
    opt = muonps.Muon(list(params.items()), **HYPER, **cluster().options(),
                      checkpoint_dir=str(tmp_path / "ckpt"),
                      checkpoint_every=10, timeout=2)
    run(opt, params, toy.gradients(2))  # step 0 checkpointed, step 1 not
    with pytest.raises(RuntimeError, match="checkpoint is of step 0, not"):
        opt.state_dict(checkpoint=True)
    opt.close()


def test_steps_due_for_a_checkpoint_and_steps_applied_as_they_land_agree(
        cluster, tmp_path):
    """One worker decides a step once its gradients are checked and applies
    each stack's updates as they land; a step due for a checkpoint commits
    only once the checkpoint is on disk, so it applies them at the commit.
    A step right after a checkpoint applies them at the commit too (a kill
    part-way through it must leave the parameters of the step before, which
    the checkpoint goes on from). Every step one way (no checkpoints), every
    step the other (checkpoint_every=1), and mixed (3: one due, one after
    it, one applied as it lands) give the same parameters, bit for bit."""
    init, grads = toy.initial(seed=3), toy.gradients(5, seed=4)
    results = {}
    for every in (0, 1, 3):
        params = toy.parameters(init)
        extra = {} if every == 0 else dict(
            checkpoint_dir=str(tmp_path / f"every{every}"),
            checkpoint_every=every)
        opt = muonps.Muon(list(params.items()), **HYPER,
                          **cluster().options(), **extra)
        run(opt, params, grads)
        opt.close()
        results[every] = snapshot(params)
    for n in init:
        assert torch.equal(results[1][n], results[0][n]), n
        assert torch.equal(results[3][n], results[0][n]), n


def test_a_non_finite_gradient_applies_nothing_on_one_worker(cluster):
    """With one worker a step is decided as soon as its gradients are
    checked: a NaN refuses it before any update lands, naming the tensor,
    and the same step with finite gradients then runs."""
    params = toy.parameters(toy.initial(seed=5))
    grads = toy.gradients(2, seed=6)
    opt = muonps.Muon(list(params.items()), **HYPER, **cluster().options())
    run(opt, params, grads[:1])
    before = snapshot(params)
    toy.set_grads(params, grads[1])
    params["w_wide"].grad[2, 5] = float("nan")
    with pytest.raises(muonps.MuonpsError, match=r"w_wide.*NaN"):
        opt.step()
    for n in params:
        assert torch.equal(params[n].detach(), before[n]), n
    run(opt, params, grads[1:])
    assert any(not torch.equal(params[n].detach(), before[n])
               for n in toy.MATRICES)
    opt.close()
