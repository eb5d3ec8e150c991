"""Routing, names, and the parameters' life in shared memory: who goes to
Muon, how unnamed parameters are called, that a training loop with closure
and zero_grad works, that frozen parameters are left alone, that
close() (or collecting the optimizer) hands the parameters back and removes
the shared-memory segment, and that a rank stepping before every rank's
worker joined the job waits for them."""

import concurrent.futures
import gc
import signal
import time

import pytest
import torch

import muonps
import toy
from reference import relative_error


@pytest.mark.parametrize("name, shape, expected", [
    ("layers.0.mlp.up.weight", (64, 16), True),
    ("experts.w1", (4, 16, 32), True),
    ("layers.0.mlp.up.bias", (64,), False),
    ("tok_embeddings.weight", (100, 16), False),
    ("embed.weight", (100, 16), False),
    ("lm_head.weight", (100, 16), False),
    ("head.weight", (10, 16), False),
    ("classifier.head.weight", (10, 16), False),
    ("output.weight", (10, 16), False),
    ("multihead.weight", (16, 16), True),
    ("conv.weight", (8, 3, 3, 3), False),
])
def test_default_is_matrix_keeps_embeddings_heads_and_vectors_on_adamw(
        name, shape, expected):
    assert muonps.default_is_matrix(name, torch.empty(shape)) is expected


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(20, 8)
        self.hidden = torch.nn.Linear(8, 16)
        self.lm_head = torch.nn.Linear(16, 20, bias=False)

    def forward(self, tokens):
        return self.lm_head(torch.tanh(self.hidden(self.embed(tokens))))


def test_training_loop_with_closure_lowers_the_loss_and_routes_by_name(cluster):
    c = cluster()
    model = TinyLM()
    opt = muonps.Muon(model.named_parameters(), lr=0.05, adamw_lr=0.02,
                      **c.options())
    tokens = torch.randint(0, 20, (64,), generator=torch.Generator().manual_seed(1))
    targets = (tokens * 7 + 3) % 20

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens), targets)
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
    state = opt.state_dict()["muonps"]
    assert list(state["momentum"]) == ["hidden.weight[0]"]
    assert sorted(state["adamw"]) == ["embed.weight", "hidden.bias",
                                      "lm_head.weight"]
    assert state["step"] == 30
    opt.close()


def test_unnamed_parameters_are_called_param_i(cluster):
    c = cluster()
    w, v = torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(4))
    opt = muonps.Muon([{"params": [v]}, {"params": [w]}], **c.options())
    w.grad, v.grad = torch.ones(6, 4), torch.ones(4)
    opt.step()
    state = opt.state_dict()["muonps"]
    assert list(state["momentum"]) == ["param.1[0]"]
    assert list(state["adamw"]) == ["param.0"]
    opt.close()


def test_frozen_parameters_are_not_stepped(cluster):
    c = cluster()
    w = torch.nn.Parameter(torch.randn(6, 4))
    frozen = torch.nn.Parameter(torch.randn(6, 4), requires_grad=False)
    before = frozen.detach().clone()
    opt = muonps.Muon([("w", w), ("frozen", frozen)], **c.options())
    w.grad = torch.randn(6, 4)
    opt.step()
    assert torch.equal(frozen, before)
    opt.close()


def test_close_keeps_the_values_and_removes_the_segment(cluster):
    c = cluster()
    w = torch.nn.Parameter(torch.randn(6, 4))
    opt = muonps.Muon([("w", w)], **c.options())
    assert len(c.leftover_segments()) == 1
    lent_at = w.data_ptr()
    w.grad = torch.randn(6, 4)
    opt.step()
    values = w.detach().clone()
    opt.close()
    assert c.leftover_segments() == []
    assert w.data_ptr() != lent_at
    assert torch.equal(w.detach(), values)
    (w * 2).sum().backward()  # still an ordinary parameter
    with pytest.raises(RuntimeError, match="closed"):
        opt.step()


def test_collecting_the_optimizer_hands_the_parameters_back(cluster):
    c = cluster()
    w = torch.nn.Parameter(torch.randn(6, 4))
    opt = muonps.Muon([("w", w)], **c.options())
    w.grad = torch.randn(6, 4)
    opt.step()
    values = w.detach().clone()
    del opt
    gc.collect()
    assert c.leftover_segments() == []
    assert torch.equal(w.detach(), values)


def test_parameter_replaced_by_the_user_is_lent_again(cluster):
    c = cluster()
    w = torch.nn.Parameter(torch.zeros(6, 4))
    opt = muonps.Muon([("w", w)], lr=0.0, weight_decay=0.0, **c.options())
    w.data = torch.full((6, 4), 3.0)  # e.g. a weight loaded by assignment
    w.grad = torch.randn(6, 4)
    opt.step()
    assert torch.equal(w.detach(), torch.full((6, 4), 3.0))
    opt.close()


def test_step_before_the_other_ranks_worker_joined_waits_for_it(cluster):
    # Workers join a job once a trainer created it, each at its next retry,
    # so the first plan may hold rank 0's worker alone. Its worker refuses
    # to attach until the plan holds a worker per trainer, so rank 0's
    # first step waits (here: until worker w1 may join) instead of failing.
    c = cluster(workers=2)
    late = c.processes[2]  # worker w1: [0] is the coordinator
    late.send_signal(signal.SIGSTOP)
    init, grads = toy.initial(seed=12), toy.gradients(1, seed=13)
    params = [toy.parameters(init) for _ in range(2)]
    hyper = dict(lr=0.02, weight_decay=0.1, adamw_weight_decay=0.01,
                 timeout=60)
    opts = [None, None]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(muonps.Muon, list(params[0].items()), **hyper,
                                **c.options(0, 2))
            time.sleep(1.0)  # rank 0's worker plans the job alone meanwhile
            assert not first.done(), first.result()
            late.send_signal(signal.SIGCONT)
            opts[1] = muonps.Muon(list(params[1].items()), **hyper,
                                  **c.options(1, 2))
            opts[0] = first.result(timeout=120)
            for rank in range(2):
                toy.set_grads(params[rank], grads[0])
            steps = [pool.submit(opt.step) for opt in opts]
            for s in steps:
                s.result(timeout=120)
    finally:
        late.send_signal(signal.SIGCONT)
    assert [opt.step_id for opt in opts] == [1, 1]
    for opt in opts:
        opt.close()
    table = {n: (0.02, 0.1) if n in toy.MATRICES else (0.02, 0.01)
             for n in init}
    expected = toy.reference_trajectory(init, grads, torch.float64,
                                        lambda step, n: table[n])[-1]
    for rank, p in enumerate(params):
        for n in init:
            error = relative_error(p[n], expected[n])
            assert error <= 1e-5, f"rank {rank} {n}: {error:.2e}"


def test_allow_momentum_reset_is_passed_to_the_job_before_start(cluster):
    # The job's allow_momentum_reset is set on the client before it starts
    # (after start the library refuses it); what it does when a worker is
    # lost is tested with real processes in tests/momentum_handover_test.cc.
    c = cluster()
    w = torch.nn.Parameter(torch.randn(6, 4))
    opt = muonps.Muon([("w", w)], allow_momentum_reset=True, **c.options())
    w.grad = torch.randn(6, 4)
    opt.step()
    with pytest.raises(muonps.MuonpsError, match="allow_momentum_reset"):
        opt._client.allow_momentum_reset(False)
    opt.close()
