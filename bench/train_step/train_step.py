#!/usr/bin/env python3
"""Times whole training iterations (zero_grad, forward, backward, optimizer
step) of a Llama-3-8B-shaped model (llama_model.py) with each optimizer of
optimizers.py's registry, and prints one JSON line per (optimizer, tokens
per GPU).

    python3 bench/train_step/train_step.py                       # one GPU
    torchrun --nproc_per_node 4 bench/train_step/train_step.py --parallel ddp
    python3 bench/train_step/train_step.py --device cpu --layers 2 \\
        --d_model 64 --heads 4 --kv_heads 2 --ffn_hidden 128 --vocab 256 \\
        --seq 32 --tokens 64 --warmup 1 --iters 2 --optimizers adamw,muonps

Per iteration, on the trainer's current stream, CUDA events split the time
into zero_grad, forward (with the loss), backward and step. The iteration
time is the host's: from before zero_grad to after torch.cuda.synchronize()
at its end (so every optimizer's step is finished inside it; muonps's
step() returns once enqueued, and the trainer's stream waits on the device
for the worker's update, so the synchronize covers it). muonps.Muon's own
synchronize() (which raises a failed step's error) is called once after the
timed iterations, outside the timed region. Then the same number of
iterations run back to back with no host wait between them, which is where
an asynchronous step can hide its host work: their mean is
`back_to_back_ms`. Under torchrun each iteration counts at its slowest rank.

Every line carries the delta against fused AdamW timed on the same model in
the same process (`--optimizers` should list adamw first), the peak memory
of the trainer (torch.cuda.max_memory_allocated, which a muonps worker's
memory, in its own process, is not part of: `device_used_gib` is the whole
GPU's), and the limits: model FLOPs per iteration, the achieved TFLOP/s
against the datasheet peak and a bf16 GEMM measured in the same run, and
the floors those put under forward + backward and under the step.
"""

import argparse
import contextlib
import gc
import json
import math
import pathlib
import re
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO = HERE.parents[1]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import limits  # noqa: E402
import optimizers  # noqa: E402
from llama_model import (LlamaConfig, LlamaModel, corpus_batches,  # noqa: E402
                         random_batches)
from parallel import Ranks  # noqa: E402

GIB = 2 ** 30


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--optimizers", default="adamw,torch_muon,muonps",
                   help="comma-separated names from optimizers.py's "
                   f"registry ({', '.join(optimizers.FACTORIES)})")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d_model", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv_heads", type=int, default=8)
    p.add_argument("--ffn_hidden", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--tokens", default="4096,16384",
                   help="tokens per GPU per iteration, a comma-separated list "
                   "(micro-batch = tokens / seq)")
    p.add_argument("--no_rope", action="store_true",
                   help="no rotary position embeddings")
    p.add_argument("--gqa", choices=("repeat", "native"), default="repeat")
    p.add_argument("--autocast", choices=("auto", "bf16", "none"),
                   default="auto", help="auto: bf16 on CUDA, none on the CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available()
                   else "cpu")
    p.add_argument("--parallel", choices=("none", "ddp", "fsdp"),
                   default="none", help="under torchrun (WORLD_SIZE > 1)")
    p.add_argument("--fsdp_bf16_params", action="store_true",
                   help="FSDP2 gathers bf16 parameters (MixedPrecisionPolicy)")
    p.add_argument("--muonps_layout", choices=("replicated", "unreduced"),
                   default="replicated",
                   help="under DDP: unreduced registers muonps.ddp's hook "
                   "instead of DDP's all-reduce")
    p.add_argument("--muonps_timeout", type=float, default=120.0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--back_to_back", type=int, default=None,
                   help="iterations timed with no host wait between them "
                   "(default: --iters; 0 skips)")
    p.add_argument("--muon_lr", type=float, default=0.02)
    p.add_argument("--muon_weight_decay", type=float, default=0.1)
    p.add_argument("--adamw_lr", type=float, default=3e-4)
    p.add_argument("--adamw_weight_decay", type=float, default=0.1)
    p.add_argument("--no_gemm", action="store_true",
                   help="skip the bf16 GEMM measured as the ceiling")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss_iters", type=int, default=0,
                   help="instead of timing: train this many iterations on "
                   "--corpus with each optimizer and seed, and print each "
                   "one's loss per iteration")
    p.add_argument("--corpus", help="a byte corpus (examples/train_gpt.py "
                   "--prepare) for --loss_iters")
    p.add_argument("--seeds", default=None,
                   help="seeds for --loss_iters (default: --seed)")
    p.add_argument("--kernel_split", type=int, default=0, metavar="N",
                   help="after the timed iterations, N more with each phase "
                   "profiled on its own (torch.profiler, the trainer's CUDA "
                   "kernels only): kernels and device ms per phase, by kind "
                   "(GPU only)")
    p.add_argument("--out", help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    if args.back_to_back is None:
        args.back_to_back = args.iters
    args.optimizers = [n for n in args.optimizers.split(",") if n]
    unknown = [n for n in args.optimizers if n not in optimizers.FACTORIES]
    if unknown:
        p.error(f"--optimizers: unknown {unknown}; registered: "
                f"{list(optimizers.FACTORIES)}")
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    args.seeds = ([int(s) for s in args.seeds.split(",") if s]
                  if args.seeds else [args.seed])
    if args.loss_iters and not args.corpus:
        p.error("--loss_iters needs --corpus")
    return args


class PhaseTimer:
    """Marks along one iteration: CUDA events on the current stream on a
    GPU (read after a synchronize), host clocks on the CPU; and the host's
    time inside step() (`step_call`: until it returns, enqueued or done)."""

    PHASES = ("zero_grad", "forward", "backward", "step")

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []
        self.step_call_ms = None  # host time inside step()

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def phases_ms(self):
        """{phase: ms} between consecutive marks (start + 4 phases)."""
        if self.cuda:
            ms = [a.elapsed_time(b) for a, b in zip(self.marks,
                                                     self.marks[1:])]
        else:
            ms = [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return {**dict(zip(self.PHASES, ms)), "step_call": self.step_call_ms}


def iteration(model, stepper, batch, autocast, vocab, timer):
    """zero_grad, forward + loss, backward, step; returns the loss."""
    tokens, targets = batch
    timer.mark()
    stepper.zero_grad()
    timer.mark()
    with autocast():
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
    timer.mark()
    loss.backward()
    timer.mark()
    called = time.perf_counter()
    stepper.step()
    timer.step_call_ms = (time.perf_counter() - called) * 1e3
    timer.mark()
    return loss


def autocast_for(args, device):
    mode = args.autocast
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" else "none"
    if mode == "none":
        return mode, contextlib.nullcontext
    return mode, lambda: torch.autocast(device.type, dtype=torch.bfloat16)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def model_and_stepper(name, cfg, args, ranks, seed):
    """The model, its weights drawn from `seed` and wrapped for the
    parallelism, and optimizer `name` over it, closed on exit (raises
    optimizers.Unavailable when it cannot run)."""
    device = ranks.device
    release(device)
    torch.manual_seed(seed)
    model = LlamaModel(cfg, device=device)
    wrapped = ranks.wrap(model)
    ctx = optimizers.Context(args=args, device=device, rank=ranks.rank,
                             world=ranks.world, parallel=ranks.parallel,
                             unwrapped=model)
    stepper = optimizers.FACTORIES[name](wrapped, ctx)
    try:
        yield wrapped, stepper
    finally:
        stepper.close()


def time_one(name, cfg, tokens, args, ranks, autocast):
    """Builds the model and optimizer `name`, times them; returns the
    measured fields (raises optimizers.Unavailable when it cannot run)."""
    device = ranks.device
    with model_and_stepper(name, cfg, args, ranks, args.seed) as (wrapped,
                                                                  stepper):
        batches = random_batches(cfg, tokens, 2, device, seed=args.seed +
                                 ranks.rank)
        for i in range(args.warmup):
            iteration(wrapped, stepper, batches[i % 2], autocast, cfg.vocab,
                      PhaseTimer(device))
            if stepper.synchronize is not None:
                stepper.synchronize()
        sync(device)
        walls, phases = [], []
        for i in range(args.iters):
            timer = PhaseTimer(device)
            ranks.barrier()
            start = time.perf_counter()
            loss = iteration(wrapped, stepper, batches[i % 2], autocast,
                             cfg.vocab, timer)
            sync(device)
            walls.append((time.perf_counter() - start) * 1e3)
            phases.append(timer.phases_ms())
        if stepper.synchronize is not None:
            stepper.synchronize()
        walls = ranks.max_over_ranks(walls)
        back_to_back = None
        if args.back_to_back:
            ranks.barrier()
            start = time.perf_counter()
            for i in range(args.back_to_back):
                loss = iteration(wrapped, stepper, batches[i % 2], autocast,
                                 cfg.vocab, _NoTimer())
            # The last step too: a trainer whose forward waits per layer
            # never makes its stream wait for it.
            if stepper.synchronize is not None:
                stepper.synchronize()
            sync(device)
            total = (time.perf_counter() - start) * 1e3
            back_to_back = ranks.max_over_ranks([total])[0] / args.back_to_back
        loss_value = float(loss.detach().float().item())
        kernels = None
        if args.kernel_split and device.type == "cuda":
            kernels = kernel_split(wrapped, stepper, batches, autocast,
                                   cfg.vocab, args.kernel_split)
        memory = {}
        if device.type == "cuda":
            peak = ranks.max_over_ranks([
                torch.cuda.max_memory_allocated(device) / GIB,
                torch.cuda.max_memory_reserved(device) / GIB])
            free, total_bytes = torch.cuda.mem_get_info(device)
            used = total_bytes - free
            memory = {"peak_allocated_gib": peak[0],
                      "peak_reserved_gib": peak[1],
                      "device_used_gib": used / GIB,
                      # CUDA contexts, and a muonps worker's memory.
                      "device_used_beyond_trainer_gib": (
                          used - torch.cuda.memory_reserved(device)) / GIB,
                      "device_total_gib": total_bytes / GIB}
        return dict(walls=walls, phases=phases, back_to_back=back_to_back,
                    loss=loss_value, memory=memory, notes=stepper.notes,
                    split=stepper.split, kernels=kernels)


KERNEL_KINDS = (
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|sm\d\d_", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn", re.I)),
    ("memset_memcpy", re.compile(r"^mem(set|cpy)", re.I)),
)


def kernel_kind(name):
    for kind, pattern in KERNEL_KINDS:
        if pattern.search(name):
            return kind
    return "elementwise_and_other"


def kernel_split(wrapped, stepper, batches, autocast, vocab, iters):
    """--kernel_split: `iters` iterations, each phase alone under
    torch.profiler (synchronized before and after, so each profile holds
    that phase's kernels of this process only: a muonps worker's are in
    its own). Per phase, per iteration: kernel count, device ms, ms by
    kind, and the kernels that took longest."""
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.autograd.DeviceType.CUDA
    split = {phase: {"kernels": 0, "device_ms": 0.0, "by_kind_ms": {},
                     "by_name_ms": {}} for phase in PhaseTimer.PHASES}
    tokens, targets = None, None

    def zero_grad():
        stepper.zero_grad()

    def forward():
        nonlocal loss
        with autocast():
            logits = wrapped(tokens)
            loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    def backward():
        loss.backward()

    def step():
        stepper.step()
        if stepper.synchronize is not None:
            stepper.synchronize()

    loss = None
    for i in range(iters):
        tokens, targets = batches[i % 2]
        for phase, run in zip(PhaseTimer.PHASES,
                              (zero_grad, forward, backward, step)):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            out = split[phase]
            for e in prof.events():
                if e.device_type != cuda:
                    continue
                ms = e.time_range.elapsed_us() / 1e3
                out["kernels"] += 1
                out["device_ms"] += ms
                kind = kernel_kind(e.name)
                out["by_kind_ms"][kind] = out["by_kind_ms"].get(kind, 0) + ms
                out["by_name_ms"][e.name] = (
                    out["by_name_ms"].get(e.name, 0) + ms)
    for out in split.values():
        out["kernels"] /= iters
        out["device_ms"] /= iters
        out["by_kind_ms"] = {k: v / iters for k, v in
                             sorted(out["by_kind_ms"].items())}
        longest = sorted(out.pop("by_name_ms").items(), key=lambda kv: -kv[1])
        out["longest"] = [[name[:100], ms / iters] for name, ms in longest[:6]]
    return split


def loss_curve(name, cfg, tokens, args, ranks, autocast, data, seed):
    """Trains optimizer `name` from seed `seed` (the model's initial
    weights and the corpus windows) for --loss_iters iterations; the loss of
    each, as this rank computed it on its batch."""
    with model_and_stepper(name, cfg, args, ranks, seed) as (wrapped,
                                                             stepper):
        batches = corpus_batches(cfg, tokens, data, ranks.device,
                                 seed=seed * 1000 + ranks.rank)
        losses = []
        for _ in range(args.loss_iters):
            loss = iteration(wrapped, stepper, next(batches), autocast,
                             cfg.vocab, _NoTimer())
            losses.append(float(loss.detach().float().item()))
        if stepper.synchronize is not None:
            stepper.synchronize()
        return losses


def release(device):
    """Frees what the previous optimizer's run left (its frames are gone
    by now) and starts the peak memory afresh."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


class _NoTimer:
    step_call_ms = None

    def mark(self):
        pass


def summarize(name, cfg, tokens, args, ranks, measured, adamw, env):
    """The JSON line of one (optimizer, tokens per GPU)."""
    walls = measured["walls"]
    median = statistics.median(walls)
    phase_ms = {f"{k}_ms": statistics.median(p[k] for p in measured["phases"])
                for k in PhaseTimer.PHASES + ("step_call",)}
    flops = cfg.flops_per_iteration(tokens)
    line = {"what": "train_step", "optimizer": name,
            "iteration_ms_median": median,
            "iteration_ms_mean": statistics.fmean(walls),
            "iteration_ms_min": min(walls), "iteration_ms_max": max(walls),
            **phase_ms,
            "back_to_back_ms": measured["back_to_back"],
            "tokens_per_s": ranks.world * tokens / (median / 1e3)}
    if adamw is not None and name != "adamw":
        line["vs_adamw"] = {
            "ratio": median / adamw["iteration_ms_median"],
            "delta_ms": median - adamw["iteration_ms_median"],
            "step_delta_ms": phase_ms["step_ms"] - adamw["step_ms"],
            "adamw_iteration_ms": adamw["iteration_ms_median"]}
    line.update(measured["memory"])
    line["model_tflop_per_iteration"] = flops["model_flops"] / 1e12
    line["achieved_tflops"] = flops["model_flops"] / (median / 1e3) / 1e12
    fwd_bwd = phase_ms["forward_ms"] + phase_ms["backward_ms"]
    line["fwd_bwd_tflops"] = flops["model_flops"] / (fwd_bwd / 1e3) / 1e12
    limit = {"gpu": env["peaks"], "gemm_bf16_tflops_measured": env["gemm"]}
    if env["peaks"]:
        peak = env["peaks"]["bf16_dense_tflops"]
        line["mfu"] = line["achieved_tflops"] / peak
        line["fwd_bwd_mfu"] = line["fwd_bwd_tflops"] / peak
    limit.update(limits.floors(cfg, flops["model_flops"], measured["split"],
                               ranks.world, ranks.parallel == "fsdp",
                               env["peaks"], env["gemm"]))
    line["limits"] = limit
    line["loss_last"] = measured["loss"]
    line["split"] = measured["split"]
    line["notes"] = measured["notes"]
    if measured["kernels"] is not None:
        line["kernel_split"] = measured["kernels"]
    line["config"] = {**{k: getattr(cfg, k) for k in (
        "layers", "d_model", "heads", "kv_heads", "ffn_hidden", "vocab",
        "seq", "rope", "gqa")}, "tokens_per_gpu": tokens,
        "micro_batch": tokens // cfg.seq, "autocast": env["autocast"],
        **cfg.counts(), "flops": flops}
    line["gpus"] = ranks.world
    line["parallel"] = ranks.parallel
    line["warmup"], line["iters"] = args.warmup, args.iters
    line["machine"] = env["machine"]
    line["timing"] = ("host wall clock per iteration, torch.cuda.synchronize()"
                      " at its end (median over iters; slowest rank); phases "
                      "from CUDA events on the trainer's stream; "
                      "back_to_back_ms: mean of iterations with no host wait"
                      if ranks.device.type == "cuda" else
                      "host wall clock per iteration and phase (CPU)")
    return line


def emit(line, args, ranks):
    if ranks.rank != 0:
        return
    text = json.dumps(line)
    print(text, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")


def loss_curves(cfg, args, ranks, autocast, env):
    """--loss_iters: a train_step_loss line per seed and optimizer; whether
    any loss was not finite."""
    data = torch.frombuffer(bytearray(pathlib.Path(args.corpus).read_bytes()),
                            dtype=torch.uint8)
    tokens = args.tokens[0]
    failed = False
    for seed in args.seeds:
        for name in args.optimizers:
            try:
                losses = loss_curve(name, cfg, tokens, args, ranks, autocast,
                                    data, seed)
            except optimizers.Unavailable as e:
                emit({"what": "train_step_loss", "optimizer": name,
                      "seed": seed, "skipped": str(e)}, args, ranks)
                continue
            failed = failed or not all(math.isfinite(x) for x in losses)
            emit({"what": "train_step_loss", "optimizer": name, "seed": seed,
                  "tokens_per_gpu": tokens, "gpus": ranks.world,
                  "parallel": ranks.parallel, "iters": args.loss_iters,
                  "loss_last": losses[-1], "losses": losses,
                  "corpus": pathlib.Path(args.corpus).name,
                  "machine": env["machine"],
                  "config": {k: getattr(cfg, k) for k in (
                      "layers", "d_model", "vocab", "seq")}},
                 args, ranks)
    return failed


def timings(cfg, args, ranks, autocast, env):
    """A train_step line per tokens per GPU and optimizer; whether any
    failed."""
    failed = False
    for tokens in args.tokens:
        adamw = None
        for name in args.optimizers:
            base = {"what": "train_step", "optimizer": name,
                    "tokens_per_gpu": tokens, "gpus": ranks.world,
                    "parallel": ranks.parallel, "machine": env["machine"]}
            try:
                measured = time_one(name, cfg, tokens, args, ranks, autocast)
            except optimizers.Unavailable as e:
                emit({**base, "skipped": str(e)}, args, ranks)
                continue
            except Exception as e:  # noqa: BLE001 - one line, then the next
                if ranks.world > 1:
                    raise  # the other ranks would wait on this one
                failed = True
                emit({**base, "error": f"{type(e).__name__}: {e}"[:4000]},
                     args, ranks)
                continue
            line = summarize(name, cfg, tokens, args, ranks, measured, adamw,
                             env)
            if name == "adamw":
                adamw = line
            if not math.isfinite(line["loss_last"]):
                line["error"] = "the loss is not finite"
                failed = True
            emit(line, args, ranks)
    return failed


def main(argv=None):
    args = parse_args(argv)
    ranks = Ranks(args.device, args.parallel, args.fsdp_bf16_params)
    device = ranks.device
    mode, autocast = autocast_for(args, device)
    env = {"machine": limits.machine(device), "peaks": limits.datasheet(device),
           "gemm": None, "autocast": mode}
    if device.type == "cuda" and not args.no_gemm:
        env["gemm"] = limits.measure_gemm_tflops(device)
    if "muonps" in args.optimizers:
        try:
            import muonps  # noqa: F401
        except ImportError:  # the package in place, from the checkout
            sys.path.insert(0, str(REPO / "client" / "python"))
    cfg = LlamaConfig(layers=args.layers, d_model=args.d_model,
                      heads=args.heads, kv_heads=args.kv_heads,
                      ffn_hidden=args.ffn_hidden, vocab=args.vocab,
                      seq=args.seq, rope=not args.no_rope, gqa=args.gqa)
    run = loss_curves if args.loss_iters else timings
    failed = run(cfg, args, ranks, autocast, env)
    ranks.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
