"""Models PyTorch shards itself, launched by torchrun with zero setup: FSDP2
(`fully_shard`, DTensor parameters that muonps takes as row_sharded, each
rank lending its own rows) and DDP, two ranks on the CPU with gloo, and the
same script with CUDA tensors and one rank on the GPU. After ten steps
every rank's parameters must equal a single-process run on the whole batch
of torch.optim.Muon's formula in float64 (reference.py; 1e-5 on the CPU,
whose workers run Newton-Schulz in fp32; 2e-2 on the GPU, whose worker runs
it in bf16 by default, as torch does) and of torch.optim.Muon itself: within
the golden tolerance (5e-3) or twice torch's own drift from the float64
run, whichever is larger. torch runs Newton-Schulz in bf16, and over ten
steps that drift reaches 1.3e-2 on the 24 x 31 matrix (measured on an H200
machine with torch 2.11; muonps's fp32 CPU path is 1e-6 from the float64
run there). A tensor-parallel DTensor
(Shard(1)) is refused, naming the parameter and its placement.

A MoE layer's 3-D expert stack, which `fully_shard` shards on its experts
(Shard(0): each rank holds whole experts), matches torch.optim.Muon run on
the same experts as separate 2-D parameters, on two CPU ranks and on GPUs.

HSDP (`fully_shard` on a 2-D replicate x shard mesh) runs the same model
on four CPU ranks, two replica groups of two: each matrix's rows are split
over the two ranks of a group, the job is created with replicas = 2, and
every rank must match the one-process run as FSDP2's do. On a machine of
one GPU the same mesh (and FSDP2 on two ranks) runs with every rank and its
worker on that GPU, each process its own NCCL host, so that NCCL's ranks
are real on both sides (over its network transport on loopback).

FSDP2 and a working torchrun need torch >= 2.4: the cases skip on
Debian's torch 1.13 (CI) and run on the GPU machine's torch 2.11.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import PACKAGE_ROOT
from reference import ReferenceMuon, relative_error

TESTS = PACKAGE_ROOT / "tests"
STEPS = 10
BATCH = 16
HYPER = dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True,
             ns_steps=5, adjust_lr_fn=None)
ADAMW = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

# The model and data both sides use: 31 rows split over two ranks as
# torch.chunk splits them (16 + 15), a wide matrix, and the head and
# biases on AdamW.
MODEL = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(12, 31)
            self.mix = torch.nn.Linear(31, 24)
            self.head = torch.nn.Linear(24, 6)

        def forward(self, x):
            return self.head(torch.tanh(self.mix(torch.tanh(self.up(x)))))

    def make_model():
        torch.manual_seed(1234)
        return Net()

    def batch(step, size):
        g = torch.Generator().manual_seed(100 + step)
        return torch.randn(size, 12, generator=g), torch.randn(size, 6, generator=g)

    # Five 16 x 31 experts as one 3-D stack (FSDP2 shards it on the
    # experts: 3 + 2 over two ranks), or, `split`, as five 2-D parameters
    # of the same values (what torch.optim.Muon can take).
    class MoE(torch.nn.Module):
        def __init__(self, split):
            super().__init__()
            self.up = torch.nn.Linear(12, 31)
            experts = torch.randn(5, 16, 31) / 31 ** 0.5
            self.split = split
            self.experts = (
                torch.nn.ParameterList(
                    [torch.nn.Parameter(e.clone()) for e in experts])
                if split else torch.nn.Parameter(experts))
            self.head = torch.nn.Linear(16, 6)

        def forward(self, x):
            w = torch.stack(list(self.experts)) if self.split else self.experts
            h = torch.tanh(self.up(x))
            h = torch.tanh(torch.einsum("bi,eoi->beo", h, w)).mean(1)
            return self.head(h)

    def make_moe(split=False):
        torch.manual_seed(1234)
        return MoE(split)
    """)

SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    import torch, torch.distributed as dist
    import muonps
    from model import make_model, make_moe, batch

    mode, device_type, out = sys.argv[1], sys.argv[2], sys.argv[3]
    environ = __import__("os").environ
    # "cuda_shared": every rank, and the worker it starts, on cuda:0, each
    # process a host of its own to NCCL (NCCL_HOSTID, which NCCL reads once,
    # at its first call), so that NCCL, which refuses two ranks of one host
    # on one GPU, joins them through its network transport on loopback.
    shared = device_type == "cuda_shared"
    if shared:
        device_type = "cuda"
        environ["NCCL_HOSTID"] = "muonps-test-rank{{}}-{{}}".format(
            environ["RANK"], __import__("os").getpid())
        environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo" if device_type == "cpu" else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = 0 if shared else int(environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu" if device_type == "cpu" else f"cuda:{{local}}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    hyper, adamw, steps, size = {hyper!r}, {adamw!r}, {steps}, {batch}
    if mode == "tp":
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device_type, (world,))
        w = torch.nn.Parameter(distribute_tensor(torch.randn(8, 8), mesh,
                                                 [Shard(1)]))
        try:
            muonps.Muon([("attn.wo", w)], lr=0.02)
        except ValueError as e:
            print("REFUSED", str(e).replace("\\n", " "), flush=True)
        dist.barrier()
        sys.exit(0)
    dtype = torch.bfloat16 if mode.endswith("_bf16") else torch.float32
    mode = mode.replace("_bf16", "")
    if mode == "fsdp_moe":  # a 3-D expert stack, FSDP2's default Shard(0)
        model = make_moe().to(device=device, dtype=dtype)
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        fully_shard(model, mesh=init_device_mesh(device_type, (world,)))
    else:
        model = make_model().to(device=device, dtype=dtype)
    if mode in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        # HSDP: 2 replica groups (replicate x shard), row-major; fully_shard
        # wants a 2-D mesh's dimensions named.
        mesh = (init_device_mesh(device_type, (world,)) if mode == "fsdp"
                else init_device_mesh(device_type, (2, world // 2),
                                      mesh_dim_names=("replicate", "shard")))
        fully_shard(model.up, mesh=mesh)
        fully_shard(model.mix, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    module = model.module if mode == "ddp" else model
    opt = muonps.Muon(module.named_parameters(), adamw_lr=adamw["lr"],
                      adamw_betas=adamw["betas"], adamw_eps=adamw["eps"],
                      adamw_weight_decay=adamw["weight_decay"], **hyper)
    half = slice(rank * size // world, (rank + 1) * size // world)
    for step in range(steps):
        x, y = batch(step, size)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(
            model(x[half].to(device=device, dtype=dtype)),
            y[half].to(device=device, dtype=dtype))
        loss.backward()
        opt.step()
    opt.synchronize()
    full = {{}}
    for n, p in module.named_parameters():
        v = p.full_tensor() if hasattr(p, "full_tensor") else p
        full[n] = v.detach().cpu().double().tolist()
    kinds = sorted({{type(p).__name__ for p in module.parameters()}})
    local = {{n: list(p.to_local().shape) for n, p in module.named_parameters()
             if hasattr(p, "to_local")}}
    replicas = opt._replicas  # the job's HSDP replica groups (1: none)
    # What the worker this rank started says of its NCCL communicators.
    nccl = [line for p in getattr(opt._service, "_processes", [])
            for line in p.log_path.read_text(errors="replace").splitlines()
            if "NCCL rank" in line or "ncclCommSplit" in line]
    opt.close()
    with open(f"{{out}}.{{rank}}", "w") as f:
        json.dump({{"params": full, "kinds": kinds, "replicas": replicas,
                   "local": local, "nccl": nccl}}, f)
    dist.barrier()
    dist.destroy_process_group()
    """)


def modern_torch():
    """FSDP2 (`torch.distributed.fsdp.fully_shard`) and a torchrun that
    starts anything (Debian's 1.13 on Python 3.11 fails before starting)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # torch 1.13 on Python 3.11 fails inside the import
        return False
    return True


needs_modern_torch = pytest.mark.skipif(
    not modern_torch(), reason="FSDP2 and torchrun need torch >= 2.4 (the "
    "GPU machine's 2.11 runs these; Debian's 1.13 cannot)")


def load_model(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib
        import model
        importlib.reload(model)
        return model
    finally:
        sys.path.remove(str(tmp_path))


def run_torchrun(tmp_path, mode, device, nproc):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(PACKAGE_ROOT), tests=str(TESTS),
                                    hyper=HYPER, adamw=ADAMW, steps=STEPS,
                                    batch=BATCH))
    (tmp_path / "model.py").write_text(MODEL)
    env = dict(os.environ, PYTHONPATH=f"{PACKAGE_ROOT}:{tmp_path}")
    env.pop("MUONPS_COORDINATOR", None)  # zero setup: rank 0 starts it
    out = tmp_path / f"{mode}-{device}.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node", str(nproc), str(script), mode, device, str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return run.stdout, [json.loads(out.with_name(f"{out.name}.{r}").read_text())
                        for r in range(nproc)] if mode != "tp" else []


def references(model_module, torch_dtype=torch.float32, moe=False):
    """(torch.optim.Muon + AdamW in `torch_dtype`, the formula in float64)
    after STEPS steps on the whole batch, one process. `moe`: the MoE
    model, its experts as 2-D parameters (torch.optim.Muon takes no 3-D
    one), stacked again as the 3-D parameter "experts" in the results."""
    results = []
    for dtype in (torch_dtype, torch.float64):
        model = (model_module.make_moe(split=True) if moe
                 else model_module.make_model()).to(dtype)
        matrices = [(n, p) for n, p in model.named_parameters()
                    if p.dim() == 2 and not n.startswith("head.")]
        names = {n for n, _ in matrices}
        others = [p for n, p in model.named_parameters() if n not in names]
        adamw = torch.optim.AdamW(others, **ADAMW)
        if dtype != torch.float64:
            muon = torch.optim.Muon([p for _, p in matrices], **HYPER)
        else:
            ref = ReferenceMuon(HYPER["momentum"], HYPER["nesterov"],
                                HYPER["ns_steps"], HYPER["adjust_lr_fn"])
        for step in range(STEPS):
            x, y = model_module.batch(step, BATCH)
            model.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x.to(dtype)),
                                         y.to(dtype)).backward()
            if dtype != torch.float64:
                muon.step()
            else:
                with torch.no_grad():
                    for n, p in matrices:
                        ref.step(n, p, p.grad, HYPER["lr"],
                                 HYPER["weight_decay"])
            adamw.step()
        params = {n: p.detach().double() for n, p in model.named_parameters()}
        experts = sorted((n for n in params if n.startswith("experts.")),
                         key=lambda n: int(n.split(".")[1]))
        if experts:
            params["experts"] = torch.stack([params.pop(n) for n in experts])
        results.append(params)
    return results


def assert_matches(results, model_module, tolerance,
                   torch_dtype=torch.float32, moe=False):
    torch_muon, exact = references(model_module, torch_dtype, moe)
    for rank, result in enumerate(results):
        for name, want in exact.items():
            got = torch.tensor(result["params"][name], dtype=torch.float64)
            error = relative_error(got, want)
            print(f"rank {rank} {name}: {error:.2e} from the float64 "
                  f"formula, {relative_error(got, torch_muon[name]):.2e} "
                  "from torch.optim.Muon")
            assert error <= tolerance, (
                f"rank {rank}: {name} is {error:.2e} from the float64 run")
            # torch.optim.Muon's own bf16 drift from the exact formula.
            drift = relative_error(torch_muon[name], want)
            error = relative_error(got, torch_muon[name])
            assert error <= max(5e-3, 2 * drift), (
                f"rank {rank}: {name} is {error:.2e} from torch.optim.Muon, "
                f"which is {drift:.2e} from the float64 formula")


@needs_modern_torch
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_two_cpu_ranks_match_one_process_torch_muon(tmp_path, mode):
    _, results = run_torchrun(tmp_path, mode, "cpu", 2)
    if mode == "fsdp":
        assert results[0]["kinds"] == ["DTensor"], results[0]["kinds"]
    assert_matches(results, load_model(tmp_path), tolerance=1e-5)


@needs_modern_torch
@pytest.mark.parametrize("device,nproc,tolerance", [
    ("cpu", 2, 1e-5),
    pytest.param("cuda", 1, 2e-2, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a GPU")),
    pytest.param("cuda", 2, 2e-2, marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="needs two GPUs")),
])
def test_an_expert_stack_fsdp_shards_on_its_experts_matches_torch_muon(
        tmp_path, device, nproc, tolerance):
    # fully_shard's default Shard(0) of the [5, 16, 31] stack: whole experts,
    # 3 on rank 0 and 2 on rank 1, each expert's gradient gathered from the
    # one rank that holds it and its update sent back there.
    _, results = run_torchrun(tmp_path, "fsdp_moe", device, nproc)
    chunk = -(-5 // nproc)
    for rank, result in enumerate(results):
        assert result["kinds"] == ["DTensor"], result["kinds"]
        held = min(5, chunk * (rank + 1)) - min(5, chunk * rank)
        assert result["local"]["experts"] == [held, 16, 31], result["local"]
    assert_matches(results, load_model(tmp_path), tolerance=tolerance,
                   moe=True)


@needs_modern_torch
@pytest.mark.parametrize("device,tolerance", [
    ("cpu", 1e-5),
    # One rank a GPU (zero setup: each rank's worker on its own GPU, NCCL
    # among the workers, the plan's two owner groups each on its own
    # communicator), Newton-Schulz in bf16.
    pytest.param("cuda", 2e-2, marks=pytest.mark.skipif(
        torch.cuda.device_count() < 4, reason="needs four GPUs")),
])
def test_four_ranks_on_an_hsdp_mesh_match_one_process_torch_muon(
        tmp_path, device, tolerance):
    # fully_shard on a (2, 2) mesh: placements (Replicate(), Shard(0)), each
    # matrix's rows split over the 2 ranks of a replica group (31 rows:
    # 16 + 15 on ranks 0 and 2, as on ranks 1 and 3), every group holding
    # the same gradients; muonps.Muon creates the job with replicas = 2.
    _, results = run_torchrun(tmp_path, "hsdp", device, 4)
    for result in results:
        assert result["kinds"] == ["DTensor"], result["kinds"]
        assert result["replicas"] == 2, result["replicas"]
    assert_matches(results, load_model(tmp_path), tolerance=tolerance)


@needs_modern_torch
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("mode,nproc,replicas", [("hsdp", 4, 2),
                                                 ("fsdp", 2, 1)])
def test_ranks_sharing_one_gpu_as_nccl_hosts_match_one_process_torch_muon(
        tmp_path, mode, nproc, replicas):
    # The 2 x 2 HSDP mesh (and FSDP2 on two ranks) with every trainer and
    # its worker on cuda:0: each process names its own NCCL host, so the
    # trainers' NCCL (FSDP2's all-gathers and reduce-scatters) and the
    # workers' (their communicator and the owner groups' splits) run with
    # 4 (2) real ranks, over NCCL's network transport on loopback instead
    # of NVLink. Zero setup: rank 0 starts the coordinator, each rank its
    # worker, whose NCCL host is its trainer's.
    _, results = run_torchrun(tmp_path, mode, "cuda_shared", nproc)
    for rank, result in enumerate(results):
        assert result["kinds"] == ["DTensor"], result["kinds"]
        assert result["replicas"] == replicas, result["replicas"]
        # Its worker joined the job's NCCL communicator as one of nproc.
        assert any(re.search(rf"NCCL rank \d of {nproc} on cuda:0", line)
                   for line in result["nccl"]), (rank, result["nccl"])
        print(f"rank {rank}'s worker:", *result["nccl"], sep="\n  ")
    assert_matches(results, load_model(tmp_path), tolerance=2e-2)


@needs_modern_torch
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_one_gpu_rank_matches_one_process_torch_muon(tmp_path, mode):
    _, results = run_torchrun(tmp_path, mode, "cuda", 1)
    assert_matches(results, load_model(tmp_path), tolerance=2e-2)


@needs_modern_torch
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_two_gpu_ranks_match_one_process_torch_muon(tmp_path, mode):
    # One rank a GPU (zero setup: each rank's worker on its own GPU, NCCL
    # among the workers), the workers' Newton-Schulz in bf16.
    _, results = run_torchrun(tmp_path, mode, "cuda", 2)
    if mode == "fsdp":
        assert results[0]["kinds"] == ["DTensor"], results[0]["kinds"]
    assert_matches(results, load_model(tmp_path), tolerance=2e-2)


@needs_modern_torch
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpu_ranks_with_bf16_parameters_drift_no_more_than_torch(
        tmp_path):
    # bf16 parameters under DDP on two GPUs: the workers keep fp32 momentum
    # and round each updated parameter once; against the float64 formula
    # they may drift as far as torch.optim.Muon on bf16 parameters does.
    _, results = run_torchrun(tmp_path, "ddp_bf16", "cuda", 2)
    model = load_model(tmp_path)
    torch_bf16, exact = references(model, torch.bfloat16)
    for rank, result in enumerate(results):
        for name, want in exact.items():
            got = torch.tensor(result["params"][name], dtype=torch.float64)
            drift = relative_error(torch_bf16[name], want)
            error = relative_error(got, want)
            print(f"rank {rank} {name}: {error:.2e} from the float64 "
                  f"formula; torch.optim.Muon in bf16: {drift:.2e}")
            assert error <= max(2e-2, 2 * drift), (rank, name, error, drift)


@needs_modern_torch
def test_tensor_parallel_dtensor_is_refused_naming_it(tmp_path):
    stdout, _ = run_torchrun(tmp_path, "tp", "cpu", 2)
    lines = [l for l in stdout.splitlines() if l.startswith("REFUSED")]
    assert len(lines) == 2, stdout
    for line in lines:
        assert "'attn.wo'" in line and "Shard(dim=1)" in line, line
        assert "tensor-parallel" in line, line
