#!/usr/bin/env python3
"""PyTorch peers of bench/ns_gpu, measured on the same GPU in the same run.

Prints one JSON line per figure (and writes them to --out for ns_gpu_bench,
which computes muonps's ratios against them):

  gemm_bf16             torch.matmul n^3 in bf16 (tflops): the GEMM rate
  gemm_bf16_half        the same at (n/2)^3; fractions divide by the higher
  torch_ns5             per Llama shape: torch.optim.Muon's NS5 in bf16
  torch_gram_ns         per Llama shape: Gram NS with plain bf16 bmm, one
                        restart after step 2
  torch_ns5_all, torch_gram_ns_all   the same over the whole 56-matrix set
  torch_muon_step_1gpu  torch.optim.Muon.step() over the set (fp32 params)
  adamw_fused_step      torch.optim.AdamW(fused=True).step() over the set

NS5 runs two ways: torch's own torch.optim._muon._zeropower_via_newtonschulz
called per matrix (as torch.optim.Muon does; it takes 2-D input only), and a
batched copy of its formula (bmm/baddbmm per shape). `ms` is the faster of
the two, so muonps is compared with the stronger peer; both are in the line.
`tflops` counts the FLOPs each variant executes (every product a dense GEMM).
Times: CUDA events, warm-up calls first, median of the repeats.

--device cpu --small runs the same logic on tiny shapes (a logic check).

The optimizer steps and the multi-GPU peers are in torch_step_peers.py
(beside this file). --owner_world N runs only the multi-GPU peers instead, as N processes (one
per GPU, NCCL; gloo with --device cpu), over the same parameters, and
appends their lines to --out:

  torch_owner_muon_step_<N>gpu  owner-based Muon: the matrices dealt out
                        round-robin by size (largest first), each owner runs
                        torch.optim.Muon (momentum, NS5 in bf16, update) on
                        its own, then every parameter is broadcast from its
                        owner (async per-matrix dist.broadcast, all waited)
  torch_ddp_allreduce_<N>gpu    an all-reduce of the fp32 gradients (async,
                        per matrix, as DDP with one bucket per large
                        parameter): the NCCL bandwidth peer; busbw_gbs is
                        nccl-tests' bus bandwidth in GB/s
Times are per step, the slowest rank's, median over the repeats. --small
also checks the owner split against one process's Muon step
(owner_check_max_rel_diff).
"""

import argparse
import json
import statistics
import sys
import time

import torch

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7
STEPS = 5
GRAM_RESTARTS = (2,)
# (rows, cols, count) over 8 Llama-3-8B layers: q+o, k+v, gate+up, down.
LLAMA_GROUPS = [(4096, 4096, 16), (1024, 4096, 16), (14336, 4096, 16),
                (4096, 14336, 8)]
SMALL_DIVISOR = 64
def own_ns5(device):
    """torch's own NS5 function and whether it takes a (batch, m, n) stack,
    or (None, reason) where this torch lacks it or it fails on a tiny
    input."""
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz as own
    except ImportError as error:
        return None, f"not importable: {error}"
    try:
        own(torch.randn(8, 16, device=device), COEFFICIENTS, STEPS, EPS)
    except Exception as error:  # a changed signature: fall back, say why
        return None, f"fails on an 8x16 matrix: {error!r}"
    try:
        out = own(torch.randn(2, 8, 16, device=device), COEFFICIENTS, STEPS,
                  EPS)
        batched = tuple(out.shape) == (2, 8, 16)
    except Exception:
        batched = False
    return own, "batched" if batched else "2-D only"


def ns5_batched(grad):
    """torch.optim.Muon's NS5 formula on a (batch, rows, cols) stack: bf16,
    wide orientation, each matrix divided by max(||X||_F, eps), then
    X <- a X + (b A + c A^2) X with A = X X^T."""
    a, b, c = COEFFICIENTS
    x = grad.bfloat16()
    tall = grad.size(-2) > grad.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=EPS)
    for _ in range(STEPS):
        gram = torch.bmm(x, x.mT)
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, update, x, beta=a)
    return x.mT if tall else x


def gram_ns_batched(grad):
    """Gram NS (kernels/README.md) with plain bf16 bmm: iterate on R = X X^T,
    P = a I + b R + c R^2, Q <- P Q, R <- P R P; after step 2 restart
    (X <- Q X, R <- X X^T, Q <- I); finally X <- Q X."""
    a, b, c = COEFFICIENTS
    x = grad.bfloat16()
    tall = grad.size(-2) > grad.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=EPS)
    r = torch.bmm(x, x.mT)
    q = None
    for step in range(STEPS):
        p = torch.baddbmm(r, r, r, beta=b, alpha=c)
        p.diagonal(dim1=-2, dim2=-1).add_(a)
        q = p if q is None else torch.bmm(p, q)
        if step + 1 == STEPS:
            break
        if step + 1 in GRAM_RESTARTS:
            x = torch.bmm(q, x)
            r = torch.bmm(x, x.mT)
            q = None
        else:
            r = torch.bmm(torch.bmm(p, r), p)
    if q is not None:
        x = torch.bmm(q, x)
    return x.mT if tall else x


def ns5_flops(rows, cols):
    m, n = min(rows, cols), max(rows, cols)
    return STEPS * (4 * m * m * n + 2 * m ** 3)


def gram_flops(rows, cols):
    """Mirrors gram_ns_batched: every product a dense GEMM."""
    m, n = min(rows, cols), max(rows, cols)
    flops, q_set = 2 * m * m * n, False
    for step in range(STEPS):
        flops += 2 * m ** 3 + (2 * m ** 3 if q_set else 0)
        q_set = True
        if step + 1 == STEPS:
            break
        if step + 1 in GRAM_RESTARTS:
            flops += 4 * m * m * n
            q_set = False
        else:
            flops += 4 * m ** 3
    return flops + (2 * m * m * n if q_set else 0)


class Timer:
    def __init__(self, device, warmup, repeats):
        self.cuda = device.type == "cuda"
        self.warmup, self.repeats = warmup, repeats

    def median_ms(self, fn, repeats=None):
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeats or self.repeats):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(times)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def relative_difference(x, ref):
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm())


class Report:
    """JSON lines on stdout and into `path`; `echo` False: nothing at all
    (the multi-GPU peers' ranks other than 0)."""

    def __init__(self, path, append=False, echo=True):
        self.echo = echo
        self.file = (open(path, "a" if append else "w")
                     if path and echo else None)

    def line(self, **fields):
        if not self.echo:
            return
        text = json.dumps(fields)
        print(text, flush=True)
        if self.file:
            self.file.write(text + "\n")
            self.file.flush()


def bench_gemm(report, timer, device, n):
    """The GEMM rate at n^3 and at (n/2)^3 (the NS shapes' size); returns the
    higher, the ceiling that fractions divide by. The large product draws
    the most power, and its rate was seen to vary between machines (667 to
    780 TFLOP/s at 8192^3 on H200s). 100 warm-up products first: the GPU
    may be idling at a low clock."""
    best = 0.0
    for size, what in ((n, "gemm_bf16"), (n // 2, "gemm_bf16_half")):
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        gemm_timer = Timer(device, max(timer.warmup, 100),
                           max(timer.repeats, 20))
        ms = gemm_timer.median_ms(lambda: torch.matmul(a, b))
        tflops = 2 * size ** 3 / ms / 1e9
        report.line(what=what, m=size, n=size, k=size, ms=ms, tflops=tflops)
        best = max(best, tflops)
    return best


SOURCES = {
    "batched_ms": "copy of torch's formula, batched per shape",
    "own_per_matrix_ms":
        "torch.optim._muon._zeropower_via_newtonschulz per matrix",
    "own_batched_ms":
        "torch.optim._muon._zeropower_via_newtonschulz per shape stack",
}


def fastest(fields):
    """The least of the NS5 variants' times and which variant it was."""
    key = min((k for k in fields if k in SOURCES), key=fields.get)
    return fields[key], SOURCES[key]


def bench_ns(report, timer, device, groups, gemm_tflops):
    own, own_kind = own_ns5(device)
    inputs = [torch.randn(count, rows, cols, device=device)
              for rows, cols, count in groups]

    def own_all(stacks):
        for stack in stacks:
            for matrix in stack:
                own(matrix, COEFFICIENTS, STEPS, EPS)

    def ns5_all(stacks):
        for stack in stacks:
            ns5_batched(stack)

    def gram_all(stacks):
        for stack in stacks:
            gram_ns_batched(stack)

    totals = {"ns5": 0.0, "gram": 0.0}
    for (rows, cols, count), stack in zip(groups, inputs):
        shape = dict(rows=rows, cols=cols, batch=count)
        ns5_ref = ns5_batched(stack[:1]).float()
        batched_ms = timer.median_ms(lambda: ns5_batched(stack))
        fields = dict(batched_ms=batched_ms)
        if own is not None:
            own_out = own(stack[0], COEFFICIENTS, STEPS, EPS).float()
            fields["own_per_matrix_ms"] = timer.median_ms(
                lambda: own_all([stack]))
            if own_kind == "batched":
                fields["own_batched_ms"] = timer.median_ms(
                    lambda: own(stack, COEFFICIENTS, STEPS, EPS))
            fields["batched_rel_diff_vs_own"] = relative_difference(
                ns5_ref[0], own_out)
        ms, source = fastest(fields)
        flops = count * ns5_flops(rows, cols)
        report.line(what="torch_ns5", **shape, ms=ms,
                    tflops=flops / ms / 1e9, source=source,
                    fraction_of_gemm_peak=flops / ms / 1e9 / gemm_tflops,
                    **fields)
        gram_ms = timer.median_ms(lambda: gram_ns_batched(stack))
        gram_out = gram_ns_batched(stack[:1]).float()
        gflops = count * gram_flops(rows, cols)
        report.line(what="torch_gram_ns", **shape, ms=gram_ms,
                    tflops=gflops / gram_ms / 1e9,
                    speedup_vs_torch_ns5=ms / gram_ms,
                    rel_diff_vs_ns5=relative_difference(gram_out, ns5_ref))
        totals["ns5"] += flops
        totals["gram"] += gflops

    matrices = sum(count for _, _, count in groups)
    batched_ms = timer.median_ms(lambda: ns5_all(inputs))
    fields = dict(batched_ms=batched_ms)
    if own is not None:
        fields["own_per_matrix_ms"] = timer.median_ms(lambda: own_all(inputs))
        if own_kind == "batched":
            fields["own_batched_ms"] = timer.median_ms(
                lambda: [own(x, COEFFICIENTS, STEPS, EPS) for x in inputs])
    ms, source = fastest(fields)
    report.line(what="torch_ns5_all", matrices=matrices, ms=ms,
                tflops=totals["ns5"] / ms / 1e9,
                fraction_of_gemm_peak=totals["ns5"] / ms / 1e9 / gemm_tflops,
                source=source, **fields)
    gram_ms = timer.median_ms(lambda: gram_all(inputs))
    report.line(what="torch_gram_ns_all", matrices=matrices, ms=gram_ms,
                tflops=totals["gram"] / gram_ms / 1e9,
                speedup_vs_torch_ns5=ms / gram_ms)


def main():
    # Here, not at the top: torch_step_peers imports this module's pieces.
    import torch_step_peers
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true",
                        help="shapes divided by 64 (logic check)")
    parser.add_argument("--out", default="", help="JSON lines file")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--set", choices=("llama", "gpt2", "moe"), default="llama",
                        help="optimizer-step matrix set (step_gpu_bench's)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64,
                        help="moe: routed experts per layer")
    parser.add_argument("--gemm_n", type=int, default=8192)
    parser.add_argument("--skip_ns", action="store_true",
                        help="GEMM and optimizer steps only (bench/step_gpu)")
    parser.add_argument("--owner_world", type=int, default=0,
                        help="> 1: only the multi-GPU peers, on this many "
                        "GPUs (processes), appended to --out")
    parser.add_argument("--owner_repeats", type=int, default=7)
    args = parser.parse_args()
    if args.owner_world:
        if args.owner_world < 2:
            sys.exit("torch_peers.py: --owner_world needs 2 or more")
        torch_step_peers.run_owner_world(args)
        return

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_peers.py: no CUDA device visible")
    torch.manual_seed(0)
    divisor = SMALL_DIVISOR if args.small else 1
    groups = [(r // divisor, c // divisor, n) for r, c, n in LLAMA_GROUPS]
    report = Report(args.out)
    timer = Timer(device, args.warmup, args.repeats)
    report.line(what="torch_env", torch=torch.__version__,
                device=(torch.cuda.get_device_name(device)
                        if device.type == "cuda" else "cpu"),
                own_ns5=own_ns5(device)[1],
                muon=hasattr(torch.optim, "Muon"), small=args.small)
    with torch.no_grad():
        gemm = bench_gemm(report, timer, device, args.gemm_n // divisor)
        if not args.skip_ns:
            bench_ns(report, timer, device, groups, gemm)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch_step_peers.bench_steps(report, timer, device, args, divisor)


if __name__ == "__main__":
    main()
