"""examples/train_gpt.py end to end on the CPU at a tiny size: the corpus
from python3-doc, muonps.Muon with no service started by hand (it starts
its own) beside AdamW on the same seeds and batches, JSON lines and the
PNG. The full-size run is for a GPU (see the script's docstring). And
examples/train_tiny_gpt.py as the README runs it, with its own service, writing
its plot outside the repository unless told where."""

import json
import math
import os
import pathlib
import shutil
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


def _fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # torch 1.13 (Debian's) has no FSDP2 nor torchrun
        return False
    return True


@pytest.mark.skipif(not SOURCES.is_dir() and not os.environ.get(
    "MUONPS_CORPUS"), reason="needs python3-doc or MUONPS_CORPUS")
@pytest.mark.skipif(not _fsdp2_available(), reason="needs torch >= 2.6")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_under_torchrun_see_the_one_process_loss(
        private, tmp_path, parallel):
    # Two CPU ranks (gloo), each on its half of the global batch: the first
    # step's loss averaged over the ranks is the one process's on the whole
    # batch (same seed, same model), and training goes on from there.
    corpus = pathlib.Path(os.environ.get("MUONPS_CORPUS", tmp_path / "c.bin"))
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    if not corpus.exists():
        subprocess.run([sys.executable, str(SCRIPT), "--prepare", str(corpus)],
                       check=True, env=env, capture_output=True)
    tiny = ["--corpus", str(corpus), "--device", "cpu", "--optimizers",
            "muonps,adamw", "--seeds", "0", "--steps", "3", "--batch", "4",
            "--seq", "32", "--layers", "2", "--width", "32", "--heads", "2",
            "--eval_every", "0"]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    run = subprocess.run([sys.executable, str(SCRIPT), *tiny, "--out",
                          str(one)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node", "2", str(SCRIPT), *tiny, "--parallel", parallel,
         "--out", str(two)], env=env, capture_output=True, text=True,
        timeout=300, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    alone = [json.loads(l) for l in one.read_text().splitlines()]
    ranks = [json.loads(l) for l in two.read_text().splitlines()]
    assert [(l["optimizer"], l["step"]) for l in ranks] == [
        (k, s) for k in ("muonps", "adamw") for s in range(3)]
    assert all(l["world"] == 2 and l["parallel"] == parallel for l in ranks)
    assert ranks[0]["loss"] == pytest.approx(alone[0]["loss"], rel=1e-4)
    assert ranks[3]["loss"] == pytest.approx(alone[3]["loss"], rel=1e-4)
    # The next steps' losses follow the one process's (same updates, up to
    # float rounding of the split batch).
    for a, b in zip(alone, ranks):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-2), (a, b)


TINY_SCRIPT = PACKAGE_ROOT.parents[1] / "examples" / "train_tiny_gpt.py"


def test_tiny_gpt_example_starts_its_own_service(private, tmp_path):
    # As the README runs it: no --coordinator, so muonps.Muon starts its own
    # coordinator and worker (zero setup, with a token of its own,
    # plaintext on loopback) and the script trains both optimizers briefly.
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    env.pop("MUONPS_TOKEN_FILE", None)
    png = tmp_path / "loss.png"
    run = subprocess.run(
        [sys.executable, str(TINY_SCRIPT), "--steps", "4", "--eval_every",
         "2", "--png", str(png)], env=env, capture_output=True, text=True,
        timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["what"] == "tiny_gpt_markov_chain"
    assert result["steps"] == 4
    assert math.isfinite(result["muonps_final_loss"])
    assert png.stat().st_size > 10_000


def test_tiny_gpt_example_writes_nothing_into_the_repository(private,
                                                             tmp_path):
    # Run from the checkout's root as the README does, without --png: the
    # plot goes to a fresh temporary folder, and the tracked figure
    # docs/tiny_gpt_loss.png stays as it is.
    repo = PACKAGE_ROOT.parents[1]
    tracked = repo / "docs" / "tiny_gpt_loss.png"
    before = tracked.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    env.pop("MUONPS_TOKEN_FILE", None)
    run = subprocess.run(
        [sys.executable, str(TINY_SCRIPT), "--steps", "2", "--eval_every",
         "2"], env=env, capture_output=True, text=True, timeout=300, cwd=repo)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [wrote] = [line.split(" ", 1)[1] for line in run.stdout.splitlines()
               if line.startswith("wrote ")]
    png = pathlib.Path(wrote)
    try:
        assert png.is_file() and png.stat().st_size > 10_000
        assert not png.resolve().is_relative_to(repo.resolve()), png
        assert tracked.read_bytes() == before
    finally:
        if not png.resolve().is_relative_to(repo.resolve()):
            shutil.rmtree(png.parent, ignore_errors=True)
