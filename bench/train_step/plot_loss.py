#!/usr/bin/env python3
"""Plots bench/train_step's loss curves (train_step.py --loss_iters, JSON
lines "train_step_loss") into one PNG: loss per iteration for every
optimizer and seed, and the last iterations enlarged, where the optimizers'
gap shows against the spread between seeds.

    python3 bench/train_step/plot_loss.py RESULTS.jsonl docs/OUT.png

Needs matplotlib (Debian: python3-matplotlib).
"""

import json
import sys

LABELS = {"adamw": "fused AdamW", "torch_muon": "torch.optim.Muon",
          "muonps": "muonps.Muon"}


def curves(path):
    """[(optimizer, seed, losses)] of the file's loss lines, in order."""
    out = []
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            if j.get("what") == "train_step_loss" and "losses" in j:
                out.append((j["optimizer"], j["seed"], j["losses"]))
    return out


def plot(lines, path, tail=50):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (whole, end) = plt.subplots(1, 2, figsize=(11, 4))
    styles = ["-", "--", ":", "-."]
    colors = {}
    for optimizer, seed, losses in lines:
        color = colors.setdefault(optimizer, f"C{len(colors)}")
        label = f"{LABELS.get(optimizer, optimizer)}, seed {seed}"
        style = styles[seed % len(styles)]
        whole.plot(range(len(losses)), losses, style, color=color, label=label)
        first = max(len(losses) - tail, 0)
        end.plot(range(first, len(losses)), losses[first:], style,
                 color=color, label=label)
    whole.set_xlabel("iteration")
    whole.set_ylabel("training loss")
    whole.set_title("loss per iteration")
    end.set_xlabel("iteration")
    end.set_title(f"the last {tail} iterations")
    end.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    lines = curves(argv[1])
    if not lines:
        print(f"plot_loss: no train_step_loss lines in {argv[1]}",
              file=sys.stderr)
        return 1
    plot(lines, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
