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
torch.optim.AdamW as the baseline. It prints (step, loss) progress, writes
docs/tiny_gpt_loss.png with both loss curves and the entropy floor, and ends
with one JSON line: {"muonps_final_loss", "adamw_final_loss",
"entropy_floor", "gap_to_floor", ...}; gap_to_floor is muonps's final
held-out loss over the floor, minus one.

    /usr/bin/python3 examples/train_tiny_gpt.py            # starts a cluster
    /usr/bin/python3 examples/train_tiny_gpt.py --coordinator 127.0.0.1:PORT \\
        --worker_socket /tmp/x/w0.sock --job JOB            # uses yours

Without --coordinator it starts one coordinator and one worker from
bazel-bin (bazel build //client:libmuonps.so
//server/coordinator:muonps-coordinator //server/worker:muonps-worker) and
stops them on exit.
"""

import argparse
import json
import math
import os
import re
import secrets
import shutil
import subprocess
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


# ------------------------------------------------------------- the cluster


class LocalCluster:
    """One coordinator and one worker from bazel-bin, stopped by close()."""

    def __init__(self, job, timeout=30.0):
        self.job = job
        self._processes = []
        # Unix socket paths are limited to 108 bytes: a short folder.
        self._folder = tempfile.mkdtemp(prefix="mps-gpt-", dir="/tmp")
        self.worker_socket = os.path.join(self._folder, "w0.sock")
        binaries = os.path.join(REPO, "bazel-bin", "server")
        coordinator_bin = os.path.join(binaries, "coordinator",
                                       "muonps-coordinator")
        worker_bin = os.path.join(binaries, "worker", "muonps-worker")
        for path in (coordinator_bin, worker_bin):
            if not os.access(path, os.X_OK):
                self.close()
                raise FileNotFoundError(
                    f"{path} is missing: run bazel build "
                    "//client:libmuonps.so //server/coordinator:"
                    "muonps-coordinator //server/worker:muonps-worker")
        # Secured by default: a fresh bearer token for this cluster (the
        # worker and this process's client read $MUONPS_TOKEN_FILE), and
        # plaintext gRPC on loopback, which the coordinator takes only with
        # --insecure.
        token = os.path.join(self._folder, "token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.environ["MUONPS_TOKEN_FILE"] = token
        try:
            log = self._start("coordinator", [
                coordinator_bin, "--port", "0", "--metrics_port", "0",
                "--insecure"])
            self.coordinator = self._wait(
                log, r"listening on ([0-9.]+:[0-9]+)", timeout)
            log = self._start("worker-w0", [
                worker_bin, "--coordinator", self.coordinator, "--job", job,
                "--worker_id", "w0", "--socket", self.worker_socket,
                "--metrics_port", "0", "--memory_bytes", str(1 << 30)])
            self._wait(log, r"listening on unix:(\S+)", timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, name, argv):
        log = os.path.join(self._folder, name + ".log")
        with open(log, "wb") as out:
            self._processes.append(subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT))
        return log

    def _wait(self, log, pattern, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(log, errors="replace") as f:
                hit = re.search(pattern, f.read())
            if hit:
                return hit.group(1)
            if any(p.poll() is not None for p in self._processes):
                break
            time.sleep(0.05)
        with open(log, errors="replace") as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"no /{pattern}/ in {log} after {timeout} s:\n"
                           f"{tail}")

    def close(self):
        for p in self._processes:
            if p.poll() is None:
                p.terminate()
        for p in self._processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._processes = []
        shutil.rmtree(self._folder, ignore_errors=True)


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
    os.makedirs(os.path.dirname(path), exist_ok=True)
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
    parser.add_argument("--png", default=os.path.join(
        REPO, "docs", "tiny_gpt_loss.png"))
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

    cluster = None
    if args.coordinator:
        if not args.worker_socket or not args.job:
            sys.exit("--coordinator needs --worker_socket and --job")
        coordinator, socket, job = (args.coordinator, args.worker_socket,
                                    args.job)
    else:
        job = f"tiny-gpt-{os.getpid()}"
        cluster = LocalCluster(job)
        coordinator, socket = cluster.coordinator, cluster.worker_socket
        print(f"local cluster: coordinator {coordinator}, worker {socket}",
              flush=True)
    runs = {}
    try:
        optimizer = muonps.Muon(
            model.named_parameters(), lr=args.lr, weight_decay=0.0,
            momentum=0.95, nesterov=True, ns_steps=5,
            adamw_lr=args.adamw_lr, adamw_betas=(0.9, 0.95),
            adamw_weight_decay=0.0, coordinator=coordinator, job=job,
            worker_socket=socket, rank=0, world_size=1)
        runs["muonps"] = train("muonps", model, optimizer, batches,
                               evaluation, args)
        close = getattr(optimizer, "close", None)
        if close is not None:
            close()
    finally:
        if cluster is not None:
            cluster.close()

    model = fresh_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.adamw_lr,
                                  betas=(0.9, 0.95), weight_decay=0.0)
    runs["AdamW"] = train("AdamW", model, optimizer, batches, evaluation,
                          args)

    plot(args.png, runs, floor,
         f"TinyGPT ({count / 1e6:.2f}M params) on a {args.vocab}-token "
         f"Markov chain, batch {args.batch}x{args.context}")
    muon_final = runs["muonps"][1][-1][1]
    adamw_final = runs["AdamW"][1][-1][1]
    print(f"wrote {args.png}", flush=True)
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
