#!/usr/bin/env python3
"""bench/train_step on the CPU, in a few seconds: a tiny config (2 layers,
d_model 64, vocabulary 256, sequence 32) for 2 timed iterations with AdamW
and with muonps.Muon (zero setup: it starts its own coordinator and worker
from the checkout's bazel-bin/). Checks that each prints one JSON line that
parses and holds the figures the GPU runs report, and that the loss-curve
mode (--loss_iters on a corpus) starts every optimizer of a seed alike.

    /usr/bin/python3 -m pytest -q bench/train_step/smoke_test.py
    /usr/bin/python3 bench/train_step/smoke_test.py

Needs `bazel build //client:libmuonps.so
//server/coordinator:muonps-coordinator //server/worker:muonps-worker`.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from llama_model import LlamaConfig, LlamaModel, random_batches  # noqa: E402

TINY = ["--device", "cpu", "--layers", "2", "--d_model", "64", "--heads",
        "4", "--kv_heads", "2", "--ffn_hidden", "128", "--vocab", "256",
        "--seq", "32", "--tokens", "64", "--warmup", "1", "--iters", "2"]


def run_bench(*extra, timeout=60):
    env = dict(os.environ)
    package = str(REPO / "client" / "python")
    env["PYTHONPATH"] = package + (os.pathsep + env["PYTHONPATH"]
                                   if env.get("PYTHONPATH") else "")
    done = subprocess.run(
        [sys.executable, str(HERE / "train_step.py"), *TINY, *extra],
        capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line]


def test_tiny_model_gives_logits_over_the_vocabulary_and_counts_its_flops():
    cfg = LlamaConfig(layers=2, d_model=64, heads=4, kv_heads=2,
                      ffn_hidden=128, vocab=256, seq=32)
    model = LlamaModel(cfg)
    assert sum(p.numel() for p in model.parameters()) == \
        cfg.counts()["total_params"]
    (tokens, targets), = random_batches(cfg, 64, 1, torch.device("cpu"))
    assert tokens.shape == (2, 32) and targets.shape == (2, 32)
    logits = model(tokens)
    assert logits.shape == (2, 32, 256)
    flops = cfg.flops_per_iteration(64)
    # 6 FLOPs per token and weight of the 14 matrices and the head.
    assert flops["matmul_flops"] == 6 * 64 * (2 * 36864 + 256 * 64)


def test_adamw_and_muonps_each_print_one_json_line_on_the_cpu():
    lines = run_bench("--optimizers", "adamw,muonps")
    assert [line["optimizer"] for line in lines] == ["adamw", "muonps"]
    for line in lines:
        assert "error" not in line, line
        assert line["what"] == "train_step"
        assert line["iteration_ms_median"] > 0
        assert line["iteration_ms_mean"] > 0
        assert line["tokens_per_s"] > 0
        assert all(line[f"{k}_ms"] >= 0 for k in
                   ("zero_grad", "forward", "backward", "step"))
        assert math.isfinite(line["loss_last"])
        assert line["config"]["tokens_per_gpu"] == 64
        assert line["config"]["micro_batch"] == 2
        assert line["model_tflop_per_iteration"] > 0
    muonps = lines[1]
    # The model decides: the 2 x 7 hidden matrices to the workers; the
    # embedding, head and norms to AdamW.
    assert muonps["split"]["muon_tensors"] == 14
    assert muonps["split"]["adamw_tensors"] == 2 + 5
    assert muonps["vs_adamw"]["adamw_iteration_ms"] == \
        lines[0]["iteration_ms_median"]


def test_loss_curves_on_a_corpus_start_alike_and_learn(tmp_path):
    # Every optimizer of a seed starts from the same weights on the same
    # windows of the corpus: the first losses are equal, and both learn.
    corpus = tmp_path / "corpus.bin"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 200)
    lines = run_bench("--optimizers", "adamw,muonps", "--loss_iters", "6",
                      "--corpus", str(corpus), "--seeds", "0,1",
                      timeout=120)
    assert [(line["optimizer"], line["seed"]) for line in lines] == [
        ("adamw", 0), ("muonps", 0), ("adamw", 1), ("muonps", 1)]
    for line in lines:
        assert line["what"] == "train_step_loss"
        assert len(line["losses"]) == 6 == line["iters"]
        assert all(math.isfinite(x) for x in line["losses"])
        assert line["losses"][-1] < line["losses"][0]
    assert lines[0]["losses"][0] == lines[1]["losses"][0]
    assert lines[2]["losses"][0] == lines[3]["losses"][0]
    assert lines[0]["losses"][0] != lines[2]["losses"][0]


if __name__ == "__main__":
    import pytest
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__]))
