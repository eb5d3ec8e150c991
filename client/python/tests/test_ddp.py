"""Two trainer processes under gloo DistributedDataParallel give the
parameters of one process on the whole batch.

Each case starts a coordinator and two workers (the `cluster` fixture), then
two trainer processes (this file run as a script, see `trainer_main`), each
with its half of a fixed batch: (a) plain DDP, whose all-reduce hands every
rank the mean gradient, with muonps.Muon(layout="replicated"); (b) DDP with
muonps.ddp.skip_allreduce_hook, so each rank keeps its own gradient, with
muonps.Muon(layout="unreduced"), whose workers average it. After five steps
both ranks' parameters must equal a float64 single-process run of
torch.optim.Muon's formula (tests/reference.py) and torch.optim.AdamW on
the whole batch, within 1e-5 relative (the workers run Newton-Schulz in
fp32, and pick NS5 or Gram NS per shape), and equal each other.

The same two cases run on one GPU where there is one (the GPU machine): the
model on cuda:0, two workers --device cuda:0 sharing it over CUDA IPC peer
copies (NCCL refuses two ranks on one GPU; DDP's gloo handles CUDA tensors),
Newton-Schulz in fp32, within 1e-4 of the float64 run. And on two GPUs
where there are two: each rank's model on its own GPU, DDP over NCCL, one
worker a GPU (--device cuda:RANK) moving tensors over the NCCL transport.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import ReferenceMuon, relative_error  # noqa: E402

STEPS = 5
BATCH = 16
WORLD = 2
TOLERANCE = 1e-5
TRAINER_SECONDS = 120
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HYPER = dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True,
             ns_steps=5, adjust_lr_fn=None, adamw_lr=0.01,
             adamw_betas=(0.9, 0.999), adamw_eps=1e-8,
             adamw_weight_decay=0.01)


class Net(torch.nn.Module):
    """Tall and wide Muon matrices; biases and the head on AdamW."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(12, 32)  # weight 32 x 12: tall
        self.mix = torch.nn.Linear(32, 24)  # weight 24 x 32: wide
        self.head = torch.nn.Linear(24, 6)

    def forward(self, x):
        return self.head(torch.tanh(self.mix(torch.tanh(self.up(x)))))


def make_model():
    torch.manual_seed(1234)
    return Net()


def make_batch():
    generator = torch.Generator().manual_seed(99)
    inputs = torch.randn(BATCH, 12, generator=generator)
    targets = torch.randn(BATCH, 6, generator=generator)
    return inputs, targets


def loss_of(model, inputs, targets):
    return torch.nn.functional.mse_loss(model(inputs), targets)


def trainer_main(config):
    """One DDP rank: trains STEPS steps on its half of the batch and saves
    its parameters (and its step-0 gradients as DDP left them)."""
    sys.path.insert(0, config["package_root"])
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import muonps
    import muonps.ddp

    rank = config["rank"]
    device = torch.device(config.get("device", "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(config.get("backend", "gloo"),
                            init_method=config["init_method"],
                            rank=rank, world_size=WORLD)
    model = DistributedDataParallel(make_model().to(device))
    if config["layout"] == "unreduced":
        model.register_comm_hook(None, muonps.ddp.skip_allreduce_hook)
    optimizer = muonps.Muon(model.module.named_parameters(),
                            layout=config["layout"], rank=rank,
                            world_size=WORLD, worker_socket=config["socket"],
                            coordinator=config["coordinator"],
                            job=config["job"], **HYPER)
    inputs, targets = (t.to(device) for t in make_batch())
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    first_grads = {}
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, inputs[half], targets[half]).backward()
        if step == 0:
            first_grads = {n: p.grad.cpu().clone()
                           for n, p in model.module.named_parameters()}
        optimizer.step()
    optimizer.synchronize()
    params = {n: p.detach().cpu().clone()
              for n, p in model.module.named_parameters()}
    optimizer.close()
    torch.save({"params": params, "first_grads": first_grads}, config["out"])
    dist.destroy_process_group()


def reference_run():
    """float64, one process, whole batch: (parameters after STEPS steps,
    gradients of step 0)."""
    model = make_model().double()
    inputs, targets = (t.double() for t in make_batch())
    matrices = {n: p for n, p in model.named_parameters()
                if p.dim() == 2 and not n.startswith("head.")}
    others = [p for n, p in model.named_parameters() if n not in matrices]
    muon = ReferenceMuon(HYPER["momentum"], HYPER["nesterov"],
                         HYPER["ns_steps"], HYPER["adjust_lr_fn"])
    adamw = torch.optim.AdamW(others, lr=HYPER["adamw_lr"],
                              betas=HYPER["adamw_betas"],
                              eps=HYPER["adamw_eps"],
                              weight_decay=HYPER["adamw_weight_decay"])
    first_grads = {}
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        loss_of(model, inputs, targets).backward()
        if step == 0:
            first_grads = {n: p.grad.clone()
                           for n, p in model.named_parameters()}
        with torch.no_grad():
            for name, p in matrices.items():
                muon.step(name, p, p.grad, HYPER["lr"], HYPER["weight_decay"])
        adamw.step()
    return dict(model.named_parameters()), first_grads


def local_grads(rank):
    """Step-0 gradients of one rank's half alone (no averaging), float64."""
    model = make_model().double()
    inputs, targets = (t.double() for t in make_batch())
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    loss_of(model, inputs[half], targets[half]).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def run_ddp(cluster, tmp_path, layout, device="cpu"):
    """Runs the two trainer ranks; returns their saved results. `device`:
    "cpu", "cuda:0" (both ranks and workers on one GPU, CUDA IPC among the
    workers) or "cuda:rank" (rank r and worker r on GPU r, NCCL among the
    workers and for DDP)."""
    devices, backend = [device] * WORLD, "gloo"
    if device == "cpu":
        c = cluster(workers=WORLD)
    elif device == "cuda:rank":
        devices, backend = [f"cuda:{r}" for r in range(WORLD)], "nccl"
        c = cluster(workers=WORLD, device=devices,
                    worker_args=("--gpu_transport", "nccl", "--precision",
                                 "fp32"))
    else:
        c = cluster(workers=WORLD, device=device,
                    worker_args=("--gpu_transport", "ipc", "--precision",
                                 "fp32"))
    init_method = f"file://{tmp_path / ('rendezvous-' + layout)}"
    processes, outputs = [], []
    for rank in range(WORLD):
        out = tmp_path / f"{layout}-rank{rank}.pt"
        outputs.append(out)
        config = dict(rank=rank, layout=layout, init_method=init_method,
                      socket=c.sockets[rank], coordinator=c.coordinator,
                      job=c.job, out=str(out), package_root=PACKAGE_ROOT,
                      device=devices[rank], backend=backend)
        log = open(tmp_path / f"{layout}-trainer{rank}.log", "wb")
        processes.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), json.dumps(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        log.close()
    deadline = time.monotonic() + TRAINER_SECONDS
    codes = []
    try:
        for p in processes:
            try:
                codes.append(p.wait(timeout=max(0.0, deadline -
                                                time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(f"still running after {TRAINER_SECONDS} s")
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        logs = "\n".join(
            f"--- trainer {r} (exit {codes[r]}):\n" +
            (tmp_path / f"{layout}-trainer{r}.log").read_text()[-3000:]
            for r in range(WORLD))
        pytest.fail(f"a {layout} trainer failed:\n{logs}", pytrace=False)
    return [torch.load(out) for out in outputs]


def assert_matches_single_process(results, tolerance=TOLERANCE):
    expected, _ = reference_run()
    for rank, result in enumerate(results):
        for name, want in expected.items():
            error = relative_error(result["params"][name], want)
            assert error <= tolerance, (
                f"rank {rank}: {name} is {error:.2e} (relative) from the "
                f"single-process run after {STEPS} steps")
    for name in expected:
        error = relative_error(results[1]["params"][name],
                               results[0]["params"][name])
        assert error <= 1e-7, f"the ranks' {name} differ by {error:.2e}"


def test_ddp_replicated_layout_matches_one_process_on_the_whole_batch(
        cluster, tmp_path):
    results = run_ddp(cluster, tmp_path, "replicated")
    _, mean_grads = reference_run()
    for rank, result in enumerate(results):
        for name, want in mean_grads.items():
            # DDP's all-reduce ran: every rank holds the whole batch's mean.
            assert relative_error(result["first_grads"][name], want) <= 1e-6
    assert_matches_single_process(results)


def test_skip_allreduce_hook_unreduced_layout_matches_one_process(
        cluster, tmp_path):
    results = run_ddp(cluster, tmp_path, "unreduced")
    for rank, result in enumerate(results):
        own = local_grads(rank)
        for name, want in own.items():
            # The hook skipped DDP's all-reduce: each rank kept its own half's
            # gradient, and the workers averaged it instead.
            assert relative_error(result["first_grads"][name], want) <= 1e-6
    assert_matches_single_process(results)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a GPU")


@needs_gpu
@pytest.mark.parametrize("layout", ["replicated", "unreduced"])
def test_ddp_on_one_gpu_with_two_workers_matches_one_process(
        cluster, tmp_path, layout):
    results = run_ddp(cluster, tmp_path, layout, device="cuda:0")
    assert_matches_single_process(results, tolerance=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("layout", ["replicated", "unreduced"])
def test_ddp_on_two_gpus_over_nccl_matches_one_process(
        cluster, tmp_path, layout):
    results = run_ddp(cluster, tmp_path, layout, device="cuda:rank")
    assert_matches_single_process(results, tolerance=1e-4)


if __name__ == "__main__":
    trainer_main(json.loads(sys.argv[1]))
