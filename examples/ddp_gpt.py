#!/usr/bin/env python3
"""A small GPT trained the way such scripts are written, with muonps.Muon
switched in by one line (the `make_optimizer` line marked below).

The script is what a DDP GPT trainer usually looks like: a token embedding
tied to the LM head, a learned position embedding, LayerNorm; a warmup +
cosine lr written into every param group each iteration; gradient
accumulation with DDP's no_sync on all micro-steps but the last;
clip_grad_norm_; torch.compile where the torch version has it (--compile);
an fp16 GradScaler on CUDA (--dtype float16); rank 0 saving the model and
`optimizer.state_dict()` every --save_every iterations, and every rank
resuming from that file (--resume). The data are sequences of a seeded
random Markov chain: no download; each rank takes its slice of every batch.

--optimizer picks muonps.Muon ("muonps"), the same split without muonps
("torch"): torch.optim.Muon for the hidden matrices plus torch.optim.AdamW
for the rest, where torch has torch.optim.Muon; otherwise the update
written out in client/python/tests/reference.py (torch 1.13, Debian's);
or AdamW for every parameter ("adamw", fused on CUDA).
The split is muonps's routing: Muon for the blocks' 2-D weights; the
embeddings (and the LM head tied to one), LayerNorms and biases for AdamW.

    # two CPU ranks (gloo), started as torchrun would start them
    PYTHONPATH=client/python python3 examples/ddp_gpt.py --cpu_ranks 2
    # two GPUs, fp16 with a GradScaler and torch.compile
    PYTHONPATH=client/python torchrun --standalone --nproc-per-node 2 \\
        examples/ddp_gpt.py --device cuda --dtype float16 --compile \\
        --iters 200 --save_every 100 --checkpoint /tmp/ckpt{iter}.pt \\
        --out /tmp/muonps-ddp-gpt.jsonl
    # the same, resumed from rank 0's checkpoint after iteration 99: its
    # lines equal the first run's from iteration 100 on (bit for bit with
    # --deterministic on both runs; without it, GPU kernels' atomics move
    # the last digits from run to run)
    PYTHONPATH=client/python torchrun --standalone --nproc-per-node 2 \\
        examples/ddp_gpt.py --device cuda --dtype float16 --compile \\
        --iters 200 --resume /tmp/ckpt99.pt --out /tmp/muonps-ddp-gpt-2.jsonl

Rank 0 writes --out: one JSON line per iteration ({"iter", "loss", "lr",
"ms"}), the loss averaged over the ranks, "ms" the iteration's wall time as
such scripts print it: forward, backward, clipping, the optimizer step and
the loss read that waits for them (the batch's generation on the CPU left
out; the GPU is idle when it starts, after the previous loss read). With --save_every N it saves
{"model", "optimizer", "iter"} to --checkpoint (where {iter} becomes the
iteration) after iteration N, 2N, ... A rank-0 save needs nothing of the
other ranks: muonps.Muon's state_dict() reads their workers' momentum.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import pathlib
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

REPO = pathlib.Path(__file__).resolve().parents[1]


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1),
                               targets.flatten())


def batches(args, rank, world):
    """Iteration i's micro-batches of this rank: a seeded Markov chain."""
    g = torch.Generator().manual_seed(args.seed)
    logits = torch.randn(args.vocab, args.vocab, generator=g) * 2.5
    chain = logits.softmax(-1)
    per_rank = args.batch // world
    for i in range(args.iters):
        g = torch.Generator().manual_seed(args.seed * 100003 + i)
        seq = torch.empty(args.accum * args.batch, args.context + 1,
                          dtype=torch.long)
        seq[:, 0] = torch.randint(args.vocab, (seq.shape[0],), generator=g)
        for t in range(args.context):
            seq[:, t + 1] = torch.multinomial(chain[seq[:, t]], 1,
                                              generator=g)[:, 0]
        micro = seq.view(args.accum, args.batch, -1)
        yield [m[rank * per_rank:(rank + 1) * per_rank] for m in micro]


def lr_at(it, args):
    """Linear warmup, then cosine to a tenth."""
    if it < args.warmup:
        return args.lr * (it + 1) / args.warmup
    ratio = (it - args.warmup) / max(1, args.iters - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * ratio)))


class MuonAdamW(torch.optim.Optimizer):
    """muonps's split without muonps: torch.optim.Muon (or, on a torch
    without it, client/python/tests/reference.py's Muon) for the matrices,
    torch.optim.AdamW for the rest; one param group each, whose "lr" the
    schedule writes."""

    def __init__(self, model, lr, weight_decay, adamw_weight_decay):
        import muonps.routing
        router = muonps.routing.Router(model)
        named = list(model.named_parameters())
        chosen = [router.decide(n, p, {}) for n, p in named]
        muon = [np for np, m in zip(named, chosen) if m]
        other = [np for np, m in zip(named, chosen) if not m]
        super().__init__([{"params": [p for _, p in muon], "kind": "muon"},
                          {"params": [p for _, p in other],
                           "kind": "adamw"}], {"lr": lr})
        self.muon_names = [n for n, _ in muon]
        kw = dict(lr=lr, weight_decay=weight_decay,
                  adjust_lr_fn="match_rms_adamw")
        if hasattr(torch.optim, "Muon"):
            self.muon = torch.optim.Muon([p for _, p in muon], **kw)
            self.reference = None
        else:
            sys.path.insert(0, str(REPO / "client" / "python" / "tests"))
            from reference import ReferenceMuon
            self.muon = None
            self.reference = ReferenceMuon(adjust_lr_fn="match_rms_adamw")
            self.weight_decay = weight_decay
        self.adamw = torch.optim.AdamW([p for _, p in other], lr=lr,
                                       weight_decay=adamw_weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        muon_lr, adamw_lr = (g["lr"] for g in self.param_groups)
        self.adamw.param_groups[0]["lr"] = adamw_lr
        if self.muon is not None:
            self.muon.param_groups[0]["lr"] = muon_lr
            self.muon.step()
        else:
            for name, p in zip(self.muon_names, self.param_groups[0]["params"]):
                if p.grad is not None:
                    self.reference.step(name, p, p.grad, muon_lr,
                                        self.weight_decay)
        self.adamw.step()

    def state_dict(self):
        return {"groups": super().state_dict(), "adamw":
                self.adamw.state_dict(), "muon": (
                    self.muon.state_dict() if self.muon is not None else
                    {k: v.clone() for k, v in self.reference.buffers.items()})}

    def load_state_dict(self, state):
        super().load_state_dict(state["groups"])
        self.adamw.load_state_dict(state["adamw"])
        if self.muon is not None:
            self.muon.load_state_dict(state["muon"])
        else:
            self.reference.buffers = {k: v.clone()
                                      for k, v in state["muon"].items()}


def make_optimizer(args, model):
    if args.optimizer == "adamw":
        fused = {"fused": True} if args.device == "cuda" else {}
        return torch.optim.AdamW(model.parameters(), lr=args.lr,
                                 weight_decay=args.adamw_weight_decay, **fused)
    if args.optimizer == "muonps":
        import muonps
        # The one line that switches the script to muonps:
        return muonps.Muon(model, lr=args.lr, weight_decay=args.weight_decay,
                           adjust_lr_fn="match_rms_adamw",
                           adamw_weight_decay=args.adamw_weight_decay)
    return MuonAdamW(model, args.lr, args.weight_decay,
                     args.adamw_weight_decay)


def train(args):
    if args.deterministic:
        # cuBLAS reproducible only with a fixed workspace, set before its
        # first call; torch then picks deterministic kernels (embedding
        # backward without atomics) and warns where it has none.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(name)s: %(message)s")
    torch.manual_seed(args.seed)
    raw = GPT(args.vocab, args.context, args.width, args.heads,
              args.layers).to(device)
    optimizer = make_optimizer(args, raw)
    first = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)
        raw.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        first = ckpt["iter"] + 1
    model = DDP(raw, device_ids=[device.index] if device.type == "cuda"
                else None)
    if args.compile and hasattr(torch, "compile"):
        model = torch.compile(model)
    fp16 = args.dtype == "float16" and device.type == "cuda"
    scaler = None
    if fp16:  # torch.amp.GradScaler where torch has it (2.3 on)
        scaler = (torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())
    if scaler is not None and args.resume and "scaler" in ckpt:
        scaler.load_state_dict(ckpt["scaler"])
    autocast = (torch.autocast("cuda", dtype=torch.float16) if fp16
                else contextlib.nullcontext())
    out = open(args.out, "a") if (args.out and rank == 0) else None
    for it, micro in enumerate(batches(args, rank, world)):
        if it < first:
            continue
        start = time.perf_counter()
        lr = lr_at(it, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=device)
        for k, seq in enumerate(micro):
            seq = seq.to(device)
            sync = k == len(micro) - 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                with autocast:
                    loss = model(seq[:, :-1], seq[:, 1:]) / len(micro)
                (scaler.scale(loss) if fp16 else loss).backward()
            total += loss.detach()
        if fp16:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw.parameters(), args.clip)
        if fp16:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(total)
        if out is not None:
            mean = total.item() / world  # waits for this iteration's work
            ms = (time.perf_counter() - start) * 1e3
            out.write(json.dumps({"iter": it, "loss": mean, "lr": lr,
                                  "ms": round(ms, 3)}) + "\n")
            out.flush()
        if args.save_every and (it + 1) % args.save_every == 0 and rank == 0:
            torch.save({"model": raw.state_dict(),
                        "optimizer": optimizer.state_dict(), "iter": it,
                        **({"scaler": scaler.state_dict()} if fp16 else {})},
                       args.checkpoint.format(iter=it))
    # Every rank's muonps worker ends with its rank: rank 0's last save
    # reads the others' momentum, so no rank leaves before it is done.
    dist.barrier()
    if hasattr(optimizer, "close"):
        optimizer.close()
    dist.destroy_process_group()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--optimizer", choices=["muonps", "torch", "adamw"],
                   default="muonps")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "float16"],
                   default="float32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels: a GPU run repeats bit for "
                   "bit, so a resume can be compared exactly")
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="global, per micro-step")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--adamw_weight_decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save_every", type=int, default=0)
    p.add_argument("--checkpoint", default="ckpt.pt",
                   help="{iter} in it is the iteration saved")
    p.add_argument("--resume", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--cpu_ranks", type=int, default=0,
                   help="start this many CPU ranks here, as torchrun would")
    return p.parse_args(argv)


def _rank_main(rank, world, port, argv):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(parse(argv))


def main(argv=None):
    args = parse(argv)
    if not args.cpu_ranks:
        return train(args)
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a for a in (argv if argv is not None else sys.argv[1:])]
    i = argv.index("--cpu_ranks")
    del argv[i:i + 2]
    mp.start_processes(_rank_main, args=(args.cpu_ranks, port, argv),
                       nprocs=args.cpu_ranks, start_method="spawn")


if __name__ == "__main__":
    main()
