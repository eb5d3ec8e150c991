"""examples/train_gpt.py end to end on the CPU at a tiny size: the corpus
from python3-doc, muonps.Muon with no service started by hand (it starts
its own) beside AdamW on the same seeds and batches, JSON lines and the
PNG. The full-size run is for a GPU (see the script's docstring)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import PACKAGE_ROOT

SCRIPT = PACKAGE_ROOT.parents[1] / "examples" / "train_gpt.py"
SOURCES = pathlib.Path("/usr/share/doc/python3.11/html/_sources")


@pytest.mark.skipif(not SOURCES.is_dir(),
                    reason="needs python3-doc (bash deploy/setup.sh)")
def test_tiny_run_writes_losses_and_a_plot(private, tmp_path):
    corpus, out, png = tmp_path / "c.bin", tmp_path / "l.jsonl", tmp_path / "p.png"
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    subprocess.run([sys.executable, str(SCRIPT), "--prepare", str(corpus)],
                   check=True, env=env, capture_output=True)
    assert corpus.stat().st_size > 5_000_000
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--corpus", str(corpus), "--device",
         "cpu", "--optimizers", "muonps,adamw", "--seeds", "0", "--steps", "4",
         "--batch", "2", "--seq", "32", "--layers", "2", "--width", "32",
         "--heads", "2", "--eval_every", "2", "--out", str(out), "--plot",
         str(png)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [(l["optimizer"], l["step"]) for l in lines] == [
        (k, s) for k in ("muonps", "adamw") for s in range(4)]
    # Same seed, same batches: the first step's loss is the same model's.
    assert lines[0]["loss"] == pytest.approx(lines[4]["loss"], rel=1e-5)
    assert all("held_out_loss" in l for l in lines if l["step"] % 2 == 1)
    assert png.stat().st_size > 10_000
