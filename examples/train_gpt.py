"""A GPT-2-small-shaped model trained on real text with muonps.Muon,
torch.optim.Muon and AdamW, in one script, with the same seeds and data.

The corpus is the Python 3.11 documentation's reST sources, which Debian's
python3-doc ships (/usr/share/doc/python3.11/html/_sources, about 12 MB),
read as bytes (a 256-token vocabulary, no tokenizer to download). The model
is GPT-2 small's shape (12 layers, 12 heads, width 768, 1024 positions;
about 86 M parameters with the byte vocabulary). Matrices of the blocks go
to Muon; embeddings, the head and norms to AdamW (torch.optim.Muon's advice).

    # here: the corpus as one file (carry it to the GPU machine)
    python3 examples/train_gpt.py --prepare corpus.bin
    # there: every optimizer and seed; JSON lines, then a PNG
    python3 examples/train_gpt.py --corpus corpus.bin --device cuda \\
        --out bench/results/$(date +%F)-h200x1-train-gpt.jsonl \\
        --plot docs/train_gpt_loss.png
    # there, on two GPUs: one rank a GPU, DDP or FSDP2 (fully_shard)
    torchrun --standalone --nproc-per-node 2 examples/train_gpt.py \\
        --corpus corpus.bin --parallel fsdp \\
        --out bench/results/$(date +%F)-h200x2-train-gpt-fsdp.jsonl

Under torchrun each rank takes its slice of the same global batch (--batch
is the global batch) on cuda:LOCAL_RANK. With --parallel ddp the model is
wrapped in DistributedDataParallel (muonps.Muon takes the all-reduced
gradients as `replicated` matrices); with --parallel fsdp each block and the
root are fully_shard-ed, and muonps.Muon takes the DTensor matrices as
`row_sharded` (the workers gather rows; nothing is gathered in Python).
Rank 0 writes --out, with the loss averaged over the ranks.

muonps.Muon needs no service started by hand (it starts its own; see
client/python/muonps/_service.py). Each line of --out is one step of one
run: optimizer, seed, step, train loss, step milliseconds (the optimizer's
step synchronized, so the three are timed alike) and elapsed seconds; every
--eval_every steps a line with the held-out loss.
"""

import argparse
import json
import math
import pathlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SOURCES = pathlib.Path("/usr/share/doc/python3.11/html/_sources")


def prepare(out):
    files = sorted(SOURCES.rglob("*.txt"))
    if not files:
        sys.exit(f"no reST sources under {SOURCES}: apt-get install python3-doc")
    data = b"\n".join(f.read_bytes() for f in files)
    pathlib.Path(out).write_bytes(data)
    print(f"{out}: {len(data)} bytes from {len(files)} files")


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, context, vocab=256):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.embed_positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed_tokens(tokens) + self.embed_positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def is_block_matrix(name, p):
    return p.dim() == 2 and name.startswith("blocks.")


class Ranks:
    """This process's place under torchrun (one rank a GPU), or a single
    process (world 1) otherwise."""

    def __init__(self, args):
        import os
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.parallel = args.parallel if self.world > 1 else "none"
        if self.world == 1:
            self.device = torch.device(args.device)
            return
        import torch.distributed as dist
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available() and args.device != "cpu":
            self.device = torch.device("cuda", local)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo")
        if args.batch % self.world:
            sys.exit(f"--batch {args.batch} does not split over "
                     f"{self.world} ranks")

    def wrap(self, model):
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            return DistributedDataParallel(
                model, device_ids=[self.device] if self.device.type == "cuda"
                else None)
        if self.parallel == "fsdp":
            try:
                from torch.distributed.fsdp import fully_shard
            except ImportError:  # torch 2.4/2.5
                from torch.distributed._composable.fsdp import fully_shard
            # A mesh of this rank's device type: by default FSDP2 shards
            # onto the machine's accelerator, so CPU ranks on a machine
            # with a GPU would find their parameters moved to it.
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device.type, (self.world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        return model

    def mean(self, value):
        """`value` (a 0-d tensor) averaged over the ranks, as a float."""
        if self.world > 1:
            import torch.distributed as dist
            value = value.detach().clone()
            dist.all_reduce(value)
            value /= self.world
        return value.item()

    def close(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.destroy_process_group()


def make_optimizer(kind, model, args):
    # DDP's wrapper prefixes names with "module."; FSDP2 keeps them.
    named = list(getattr(model, "module", model).named_parameters())
    matrices = [p for n, p in named if is_block_matrix(n, p)]
    others = [p for n, p in named if not is_block_matrix(n, p)]
    adamw = dict(lr=args.lr_adamw, betas=(0.9, 0.95), weight_decay=0.0)
    if kind == "muonps":
        import muonps
        return [muonps.Muon(named, lr=args.lr_muon, weight_decay=args.wd_muon,
                            adamw_lr=args.lr_adamw, adamw_betas=(0.9, 0.95),
                            adamw_weight_decay=0.0, is_matrix=is_block_matrix)]
    if kind == "torch_muon":
        return [torch.optim.Muon(matrices, lr=args.lr_muon,
                                 weight_decay=args.wd_muon),
                torch.optim.AdamW(others, **adamw)]
    if kind == "adamw":
        return [torch.optim.AdamW([p for _, p in named],
                                  lr=args.lr_adamw, betas=(0.9, 0.95),
                                  weight_decay=0.1)]
    raise ValueError(f"--optimizers: unknown {kind!r}")


def batches(data, seed, args, device, ranks=None):
    """The same sequence of (input, target) batches for every optimizer;
    under torchrun each rank's slice of the global batch."""
    g = torch.Generator().manual_seed(1000 + seed)
    train = len(data) - len(data) // 20  # the last 5% is held out
    while True:
        start = torch.randint(0, train - args.seq - 1, (args.batch,), generator=g)
        rows = torch.stack([data[s:s + args.seq + 1] for s in start.tolist()])
        if ranks is not None and ranks.world > 1:
            share = args.batch // ranks.world
            rows = rows[ranks.rank * share:(ranks.rank + 1) * share]
        rows = rows.to(device=device, dtype=torch.long)
        yield rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def held_out_loss(model, data, args, device, ranks):
    g = torch.Generator().manual_seed(7)
    train = len(data) - len(data) // 20
    start = torch.randint(train, len(data) - args.seq - 1, (args.batch,),
                          generator=g)
    rows = torch.stack([data[s:s + args.seq + 1] for s in start.tolist()])
    if ranks.world > 1:
        share = args.batch // ranks.world
        rows = rows[ranks.rank * share:(ranks.rank + 1) * share]
    rows = rows.to(device=device, dtype=torch.long)
    logits = model(rows[:, :-1])
    return ranks.mean(
        F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()))


def run(kind, seed, data, args, out, ranks):
    device = ranks.device
    torch.manual_seed(seed)
    model = ranks.wrap(
        Gpt(args.layers, args.width, args.heads, args.seq).to(device))
    optimizers = make_optimizer(kind, model, args)
    sync = (torch.cuda.synchronize if device.type == "cuda" else lambda: None)
    data_iter = batches(data, seed, args, device, ranks)
    begin = time.perf_counter()
    for step in range(args.steps):
        x, y = next(data_iter)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        for o in optimizers:
            o.zero_grad()
        loss.backward()
        sync()
        start = time.perf_counter()
        for o in optimizers:
            o.step()
        if hasattr(optimizers[0], "synchronize"):
            optimizers[0].synchronize()
        sync()
        step_ms = (time.perf_counter() - start) * 1e3
        line = {"optimizer": kind, "seed": seed, "step": step,
                "loss": ranks.mean(loss), "step_ms": step_ms,
                "elapsed_s": time.perf_counter() - begin}
        if ranks.world > 1:
            line.update(world=ranks.world, parallel=ranks.parallel)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            line["held_out_loss"] = held_out_loss(model, data, args, device,
                                                  ranks)
        if out is not None:
            out.write(json.dumps(line) + "\n")
            out.flush()
        if ranks.rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"{kind} seed {seed} step {step}: loss {line['loss']:.4f} "
                  f"({step_ms:.1f} ms)", file=sys.stderr)
    for o in optimizers:
        if hasattr(o, "close"):
            o.close()


def plot(lines, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for kind in sorted({l["optimizer"] for l in lines}):
        runs = {}
        for l in lines:
            if l["optimizer"] == kind:
                runs.setdefault(l["seed"], []).append(l)
        steps = min(len(r) for r in runs.values())
        mean = [sum(r[i]["loss"] for r in runs.values()) / len(runs)
                for i in range(steps)]
        clock = [sum(r[i]["elapsed_s"] for r in runs.values()) / len(runs)
                 for i in range(steps)]
        label = f"{kind} ({len(runs)} seeds)"
        by_step.plot(range(steps), mean, label=label)
        by_time.plot(clock, mean, label=label)
    by_step.set(xlabel="step", ylabel="train loss (nats/byte)")
    by_time.set(xlabel="wall time (s)", ylabel="train loss (nats/byte)")
    for ax in (by_step, by_time):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", help="write the corpus to this file and exit")
    ap.add_argument("--corpus", help="corpus file (default: read the sources)")
    ap.add_argument("--optimizers", default="muonps,torch_muon,adamw")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--lr_muon", type=float, default=0.02)
    ap.add_argument("--wd_muon", type=float, default=0.0)
    ap.add_argument("--lr_adamw", type=float, default=6e-4)
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available()
                    else "cpu")
    ap.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp",
                    help="under torchrun: DistributedDataParallel or FSDP2")
    ap.add_argument("--out", default="train_gpt.jsonl")
    ap.add_argument("--plot", help="PNG of loss against steps and wall time")
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    if args.corpus:
        raw = pathlib.Path(args.corpus).read_bytes()
    else:
        raw = b"\n".join(f.read_bytes() for f in sorted(SOURCES.rglob("*.txt")))
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    kinds = args.optimizers.split(",")
    if "torch_muon" in kinds and not hasattr(torch.optim, "Muon"):
        sys.exit(f"torch {torch.__version__} has no torch.optim.Muon: drop "
                 "torch_muon from --optimizers")
    ranks = Ranks(args)
    out = open(args.out, "w") if ranks.rank == 0 else None
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            for kind in kinds:
                run(kind, seed, data, args, out, ranks)
    finally:
        if out is not None:
            out.close()
        ranks.close()
    if args.plot and ranks.rank == 0:
        lines = [json.loads(l) for l in open(args.out)]
        plot(lines, args.plot)


if __name__ == "__main__":
    main()
