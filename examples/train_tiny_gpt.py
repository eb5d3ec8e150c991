#!/usr/bin/env python3
"""Trains a tiny GPT on a random Markov chain with muonps.Muon and with AdamW.

The data are sequences of a random first-order Markov chain over a small
vocabulary, started from its stationary distribution. Every predicted token
has its predecessor in context, so the lowest reachable next-token loss is
the chain's entropy rate H = -sum_i pi_i sum_j P_ij log P_ij (nats), computed
exactly here from the transition matrix P and the stationary distribution pi.

The same model (same initialization, same batches, same steps and schedule)
trains twice on the CPU: once with muonps.Muon through a local muonps
cluster (the transformer's matrices on the worker with Muon; embeddings,
output head and layer norms with the client's AdamW), once with
torch.optim.AdamW as the baseline. It prints (step, loss) progress, writes a
PNG with both loss curves and the entropy floor (into a fresh temporary
folder unless --png names the file), and ends with one JSON line:
{"muonps_final_loss", "adamw_final_loss", "entropy_floor", "gap_to_floor",
...}; gap_to_floor is muonps's final held-out loss over the floor, minus
one.

    /usr/bin/python3 examples/train_tiny_gpt.py            # its own service
    /usr/bin/python3 examples/train_tiny_gpt.py --png loss.png
    /usr/bin/python3 examples/train_tiny_gpt.py --coordinator 127.0.0.1:PORT \\
        --worker_socket /tmp/x/w0.sock --job JOB            # uses yours

Without --coordinator, muonps.Muon starts its own coordinator and worker
(zero setup: from the installed package, or the checkout's bazel-bin after
`bazel build //client:libmuonps.so //server/coordinator:muonps-coordinator
//server/worker:muonps-worker`) and stops them when it is closed.
docs/tiny_gpt_loss.png is this script's figure at its defaults; refresh it
only on purpose, with --png docs/tiny_gpt_loss.png.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch

from tiny_gpt_model import TinyGPT, next_token_loss

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "client", "python"))


# ---------------------------------------------------------------- the data


class MarkovChain:
    """A random sparse first-order Markov chain and its exact entropy rate."""

    def __init__(self, vocab, successors, seed):
        rng = np.random.default_rng(seed)
        p = np.zeros((vocab, vocab))
        for i in range(vocab):
            # i -> i+1 keeps the chain irreducible; the self-loop of state 0
            # makes it aperiodic, so pi is unique and sampling mixes.
            targets = {(i + 1) % vocab}
            if i == 0:
                targets.add(0)
            while len(targets) < successors:
                targets.add(int(rng.integers(vocab)))
            targets = sorted(targets)
            p[i, targets] = rng.dirichlet(np.full(len(targets), 0.5))
        self.transitions = p
        self.vocab = vocab
        # Stationary distribution: the left eigenvector for eigenvalue 1.
        values, vectors = np.linalg.eig(p.T)
        pi = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
        self.stationary = pi / pi.sum()
        assert np.allclose(self.stationary @ p, self.stationary, atol=1e-10)
        with np.errstate(divide="ignore", invalid="ignore"):
            row_entropy = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
        self.entropy_rate = float(self.stationary @ row_entropy)
        self._cdf = np.cumsum(p, axis=1)

    def sample(self, count, length, rng):
        """`count` sequences of `length` tokens, int64 [count, length]."""
        out = np.empty((count, length), dtype=np.int64)
        out[:, 0] = rng.choice(self.vocab, size=count, p=self.stationary)
        for t in range(1, length):
            u = rng.random(count)[:, None]
            nxt = (self._cdf[out[:, t - 1]] < u).sum(axis=1)
            out[:, t] = np.minimum(nxt, self.vocab - 1)
        return out


# ------------------------------------------------------------ the training


def schedule(step, steps, warmup):
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(name, model, optimizer, batches, evaluation, args):
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: schedule(s, args.steps, args.warmup))
    curve, evals = [], []
    start = time.time()
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model, batches[step])
        loss.backward()
        optimizer.step()
        scheduler.step()
        curve.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            with torch.no_grad():
                held_out = next_token_loss(model, evaluation).item()
            evals.append((step + 1, held_out))
            print(f"{name:7s} step {step + 1:4d}  loss {curve[-1]:.4f}  "
                  f"held-out {held_out:.4f}  {time.time() - start:6.1f} s",
                  flush=True)
    return curve, evals, time.time() - start


def plot(path, runs, floor, title):
    """Two panels: the whole run, and a zoom on the approach to the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=120)
    colors = {"muonps": "tab:blue", "AdamW": "tab:orange"}
    # The smoothing window, no longer than the run (a short --steps run).
    window = min(10, len(next(iter(runs.values()))[0]))
    zoom_from = len(next(iter(runs.values()))[0]) // 6
    for ax, zoom in zip(axes, (False, True)):
        for name, (curve, evals, _) in runs.items():
            steps = np.arange(1, len(curve) + 1)
            ax.plot(steps, curve, color=colors[name], alpha=0.25,
                    linewidth=0.8)
            smooth = np.convolve(curve, np.ones(window) / window,
                                 mode="valid")
            ax.plot(steps[window - 1:], smooth, color=colors[name],
                    linewidth=1.8,
                    label=f"{name}: train loss ({window}-step mean)")
            e_steps, e_loss = zip(*evals)
            ax.plot(e_steps, e_loss, "o", color=colors[name], markersize=4,
                    label=f"{name}: held-out loss")
        ax.axhline(floor, color="black", linestyle="--", linewidth=1.2,
                   label=f"entropy rate {floor:.4f} nats (the floor)")
        ax.axhline(floor * 1.05, color="gray", linestyle=":", linewidth=1.2,
                   label="floor + 5%")
        ax.set_xlabel("optimizer step")
        ax.grid(True, alpha=0.3)
        if zoom:
            ax.set_xlim(zoom_from, len(curve) + 2)
            ax.set_ylim(floor * 0.98, floor * 1.10)
            ax.set_title("zoom: the approach to the floor")
        else:
            ax.set_ylabel("next-token cross-entropy (nats)")
            ax.set_title("whole run")
            ax.legend(loc="upper right", fontsize=8.5)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coordinator", default="",
                        help="HOST:PORT of a running coordinator; empty: "
                        "start one coordinator and one worker here")
    parser.add_argument("--worker_socket", default="",
                        help="the local worker's Unix socket (with "
                        "--coordinator)")
    parser.add_argument("--job", default="",
                        help="the job the worker joined (with --coordinator)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--successors", type=int, default=5,
                        help="nonzero transitions per state")
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.02,
                        help="Muon learning rate")
    parser.add_argument("--adamw_lr", type=float, default=3e-3,
                        help="AdamW learning rate (baseline, and muonps's "
                        "embeddings, head and norms)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--png", default="",
                        help="where to write the loss plot (default: "
                        "tiny_gpt_loss.png in a fresh temporary folder)")
    return parser.parse_args()


def main():
    args = parse_args()
    import muonps

    chain = MarkovChain(args.vocab, args.successors, seed=args.seed)
    rng = np.random.default_rng(args.seed + 1)
    length = args.context + 1
    batches = torch.from_numpy(chain.sample(args.steps * args.batch, length,
                                            rng)).view(args.steps, args.batch,
                                                       length)
    evaluation = torch.from_numpy(chain.sample(512, length, rng))
    floor = chain.entropy_rate
    print(f"Markov chain: {args.vocab} tokens, {args.successors} successors "
          f"per state, entropy rate {floor:.4f} nats/token", flush=True)

    def fresh_model():
        torch.manual_seed(args.seed)
        return TinyGPT(args.vocab, args.context, args.width, args.heads,
                       args.layers)

    model = fresh_model()
    count = sum(p.numel() for p in model.parameters())
    print(f"TinyGPT: {count / 1e6:.2f}M parameters, {args.layers} blocks, "
          f"width {args.width}, context {args.context}", flush=True)

    service = {}
    if args.coordinator:
        if not args.worker_socket or not args.job:
            sys.exit("--coordinator needs --worker_socket and --job")
        service = dict(coordinator=args.coordinator, job=args.job,
                       worker_socket=args.worker_socket)
    else:
        # Zero setup: no coordinator (in the environment either), so
        # muonps.Muon starts its own coordinator and worker.
        os.environ.pop("MUONPS_COORDINATOR", None)
    runs = {}
    optimizer = muonps.Muon(
        model.named_parameters(), lr=args.lr, weight_decay=0.0,
        momentum=0.95, nesterov=True, ns_steps=5,
        adamw_lr=args.adamw_lr, adamw_betas=(0.9, 0.95),
        adamw_weight_decay=0.0, rank=0, world_size=1, **service)
    try:
        if not args.coordinator:
            print(f"muonps service: coordinator {optimizer._service.coordinator}"
                  f", worker {optimizer._service.socket}", flush=True)
        runs["muonps"] = train("muonps", model, optimizer, batches,
                               evaluation, args)
    finally:
        optimizer.close()

    model = fresh_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.adamw_lr,
                                  betas=(0.9, 0.95), weight_decay=0.0)
    runs["AdamW"] = train("AdamW", model, optimizer, batches, evaluation,
                          args)

    png = args.png or os.path.join(
        tempfile.mkdtemp(prefix="muonps-tiny-gpt-"), "tiny_gpt_loss.png")
    plot(png, runs, floor,
         f"TinyGPT ({count / 1e6:.2f}M params) on a {args.vocab}-token "
         f"Markov chain, batch {args.batch}x{args.context}")
    muon_final = runs["muonps"][1][-1][1]
    adamw_final = runs["AdamW"][1][-1][1]
    print(f"wrote {png}", flush=True)
    print(json.dumps({
        "what": "tiny_gpt_markov_chain",
        "muonps_final_loss": round(muon_final, 5),
        "adamw_final_loss": round(adamw_final, 5),
        "entropy_floor": round(floor, 5),
        "gap_to_floor": round(muon_final / floor - 1.0, 5),
        "adamw_gap_to_floor": round(adamw_final / floor - 1.0, 5),
        "steps": args.steps,
        "parameters": count,
        "muonps_train_s": round(runs["muonps"][2], 1),
        "adamw_train_s": round(runs["AdamW"][2], 1),
    }))


if __name__ == "__main__":
    main()
