#!/usr/bin/env python3
"""torch_peers.py's optimizer-step peers: the matrix sets (step_gpu_bench's
Llama-3-8B and DeepSeek-V3-like MoE layers), torch.optim.Muon and fused
AdamW steps on one GPU, and the owner-based Muon and all-reduce peers on
several (--owner_world; torch.multiprocessing.spawn runs owner_rank_main
from this module). torch_peers.py's docstring lists the lines they print."""
import datetime
import math
import os
import socket
import statistics
import sys
import time

import torch

from torch_peers import (COEFFICIENTS, EPS, SMALL_DIVISOR, STEPS, Report,
                         ns5_batched, own_ns5, relative_difference)

# One layer's matrices in order (q, k, v, o, gate, up, down).
LLAMA_LAYER = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096),
               (14336, 4096), (14336, 4096), (4096, 14336)]
# One DeepSeek-V3-like MoE layer (bench/step_gpu/llama_matrices.h's
# MoeMatrices): MLA attention, then the shared and each routed expert's
# gate, up, down.
MOE_ATTENTION = [(1536, 7168), (24576, 1536), (576, 7168), (32768, 512),
                 (7168, 16384)]
MOE_EXPERT = [(2048, 7168), (2048, 7168), (7168, 2048)]
# One GPT-2-small block (GPT2SmallMatrices): q/k/v, attention output, MLP.
GPT2_BLOCK = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def layer_shapes(matrix_set, experts):
    """One layer's matrix shapes, in step_gpu_bench's order."""
    if matrix_set == "moe":
        return MOE_ATTENTION + MOE_EXPERT * (experts + 1)
    if matrix_set == "gpt2":
        return GPT2_BLOCK
    return LLAMA_LAYER


def model_parameters(device, args, divisor):
    """The set's parameters (--set, --layers, --experts), with gradients."""
    params = []
    for _ in range(args.layers):
        for rows, cols in layer_shapes(args.set, args.experts):
            p = torch.nn.Parameter(
                torch.randn(rows // divisor, cols // divisor, device=device)
                * 0.02)
            p.grad = torch.randn_like(p) * 1e-3
            params.append(p)
    return params


def bench_steps(report, timer, device, args, divisor):
    params = model_parameters(device, args, divisor)
    count = sum(p.numel() for p in params)
    muon_ms = None
    if hasattr(torch.optim, "Muon"):
        muon = torch.optim.Muon(params, lr=0.02, weight_decay=0.1,
                                momentum=0.95, nesterov=True)
        muon_ms = timer.median_ms(muon.step, repeats=5)
        report.line(what="torch_muon_step_1gpu", ms=muon_ms,
                    matrices=len(params), params=count)
        del muon
    else:
        report.line(what="torch_muon_step_1gpu", skipped=(
            "torch.optim.Muon is missing in torch " + torch.__version__))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        adamw = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01,
                                  fused=True)
        fused = True
    except (RuntimeError, TypeError):  # fused=True needs CUDA in old torch
        adamw = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
        fused = False
    adamw_ms = timer.median_ms(adamw.step, repeats=5)
    fields = {}
    if muon_ms is not None:
        fields["torch_muon_over_adamw"] = muon_ms / adamw_ms
    report.line(what="adamw_fused_step", ms=adamw_ms, fused=fused,
                matrices=len(params), params=count, **fields)


def owners_by_size(sizes, world):
    """Owner rank per matrix: sorted by size, largest first (ties by index),
    dealt out to the ranks in turn."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    owner = [0] * len(sizes)
    for k, i in enumerate(order):
        owner[i] = k % world
    return owner


def muon_reference_ns5(update):
    """torch.optim.Muon's NS5 on one matrix: torch's own function where this
    torch has it, else the same formula (ns5_batched on a stack of one)."""
    own, _ = own_ns5(update.device)
    if own is not None:
        return own(update, COEFFICIENTS, STEPS, EPS)
    return ns5_batched(update[None])[0]


class ManualMuon:
    """torch.optim.Muon's step (momentum lerp, Nesterov, NS5 in bf16,
    "original" lr adjustment, decoupled weight decay), for a torch that has
    no torch.optim.Muon (the CPU logic check on torch 1.13)."""

    def __init__(self, params, lr, weight_decay, momentum, nesterov):
        self.params = list(params)
        self.lr, self.wd = lr, weight_decay
        self.momentum, self.nesterov = momentum, nesterov
        self.bufs = [torch.zeros_like(p) for p in self.params]

    def step(self):
        mu = self.momentum
        for p, buf in zip(self.params, self.bufs):
            grad = p.grad
            buf.lerp_(grad, 1 - mu)
            update = grad.lerp(buf, mu) if self.nesterov else buf
            update = muon_reference_ns5(update)
            rows, cols = p.shape[:2]
            adjusted = self.lr * math.sqrt(max(1, rows / cols))
            p.mul_(1 - self.lr * self.wd)
            p.add_(update.to(p.dtype), alpha=-adjusted)


def make_muon(params):
    kwargs = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)
    if hasattr(torch.optim, "Muon"):
        return torch.optim.Muon(params, **kwargs), "torch.optim.Muon"
    return ManualMuon(params, **kwargs), "copy of torch.optim.Muon's step"


def median_slowest_ms(fn, device, warmup, repeats):
    """Runs fn warmup times, then times repeats calls that all ranks start
    together (barrier); returns the median over repeats of the slowest
    rank's time, and this rank's own median."""
    import torch.distributed as dist

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        dist.barrier()
        sync()
        begin = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - begin) * 1e3)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist()), statistics.median(times)


def owner_rank_main(rank, world, args, port):
    """One rank of the multi-GPU peers (torch.multiprocessing.spawn)."""
    import torch.distributed as dist
    cuda = args.device != "cpu"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    init = dict(backend="nccl" if cuda else "gloo",
                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        dist.init_process_group(**init, **(dict(device_id=device)
                                           if cuda else {}))
    except TypeError:  # a torch without device_id
        dist.init_process_group(**init)
    report = Report(args.out, append=True, echo=rank == 0)
    divisor = SMALL_DIVISOR if args.small else 1
    torch.manual_seed(0)  # the same parameters and gradients on every rank
    with torch.no_grad():
        params = model_parameters(device, args, divisor)
        count = sum(p.numel() for p in params)
        owner = owners_by_size([p.numel() for p in params], world)
        owned = [p for p, o in zip(params, owner) if o == rank]
        per_rank = [sum(p.numel() for p, o in zip(params, owner) if o == r)
                    for r in range(world)]
        muon, source = make_muon(owned)
        reference = None
        if args.small and rank == 0:
            reference = [p.detach().clone() for p in params]
            for r, p in zip(reference, params):
                r.grad = p.grad.clone()

        def owner_step():
            if owned:
                muon.step()
            handles = [dist.broadcast(p.data, src=o, async_op=True)
                       for p, o in zip(params, owner)]
            for handle in handles:
                handle.wait()

        check = {}
        if args.small:
            owner_step()  # the first step, checked against one process
            if rank == 0:
                make_muon(reference)[0].step()
                check["owner_check_max_rel_diff"] = max(
                    relative_difference(p.detach(), r)
                    for p, r in zip(params, reference))
        ms, own_ms = median_slowest_ms(owner_step, device, args.warmup,
                                       args.owner_repeats)
        report.line(what=f"torch_owner_muon_step_{world}gpu", ms=ms,
                    rank0_ms=own_ms, ranks=world, matrices=len(params),
                    params=count, source=source,
                    owned_params_max_over_mean=(
                        max(per_rank) / (sum(per_rank) / world)),
                    backend=init["backend"], **check)
        del muon
        if cuda:
            torch.cuda.empty_cache()

        def allreduce():
            handles = [dist.all_reduce(p.grad, async_op=True) for p in params]
            for handle in handles:
                handle.wait()

        ms, own_ms = median_slowest_ms(allreduce, device, args.warmup,
                                       args.owner_repeats)
        grad_bytes = 4 * count
        per_rank_bytes = 2 * (world - 1) / world * grad_bytes
        report.line(what=f"torch_ddp_allreduce_{world}gpu", ms=ms,
                    rank0_ms=own_ms, ranks=world, bytes=grad_bytes,
                    bytes_sent_per_rank=per_rank_bytes,
                    busbw_gbs=per_rank_bytes / ms / 1e6,
                    calls=len(params), dtype="float32")
    dist.barrier()
    dist.destroy_process_group()


def run_owner_world(args):
    """The multi-GPU peers on args.owner_world processes."""
    import torch.multiprocessing as mp
    # NVLink multicast stays off (KINDS.md); the children inherit these.
    for name, value in (("NCCL_NVLS_ENABLE", "0"),
                        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(name, value)
    world = args.owner_world
    if args.device != "cpu":
        if not torch.cuda.is_available():
            sys.exit("torch_peers.py: no CUDA device visible")
        if torch.cuda.device_count() < world:
            sys.exit(f"torch_peers.py: --owner_world {world} needs {world} "
                     f"GPUs, {torch.cuda.device_count()} visible")
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(owner_rank_main, args=(world, args, port), nprocs=world,
             join=True)
