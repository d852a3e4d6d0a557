"""sam-run, sam-eval and sam-landscape on image-folder runs: λ_max during training, the same λ_max
and the whole-set numbers in sam-eval, the same measurement subset everywhere, landscape slices
and the pair (real training on PNG/JPEG trees the test writes)."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import compose
from folder_files import write_tree

from sam_runner.results.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
MEASURE = ["metrics.hessian.num_samples=64", "metrics.hessian.max_iter=30"]


@functools.lru_cache(maxsize=None)
def session() -> Path:
    root = Path(tempfile.mkdtemp(prefix="sam-folder-"))
    atexit.register(shutil.rmtree, root, True)
    write_tree(root / "tree")
    return root


def folder_args(root: Path) -> list[str]:
    return [
        "dataset=image_folder",
        f"dataset.root={root}",
        "dataset.image_size=32",
        "dataset.num_workers=0",
        "dataset.batch_size=24",
        "model=cnn",
        "model.channels=8",
        "trainer.epochs=1",
        "trainer.progress=none",
        *MEASURE,
    ]


@functools.lru_cache(maxsize=None)
def trained(seed: int) -> Path:
    from sam_runner.train import train

    run = session() / f"run{seed}"
    args = [*folder_args(session() / "tree"), f"seed={seed}"]
    cfg = compose(*args)
    hydra = run / ".hydra"
    hydra.mkdir(parents=True)
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, hydra / "config.yaml")
    OmegaConf.save(OmegaConf.create(args), hydra / "overrides.yaml")
    train(cfg, run, args)
    return run


def last_row(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "lambda_max" in r][-1]


def test_training_logs_lambda_max_and_sam_eval_repeats_it(tmp_path):
    from eval_helpers import sam_eval

    run = Path(shutil.copytree(trained(0), tmp_path / "run"))
    row = last_row(run)
    assert isinstance(row["lambda_max"], float) and row["lambda_max"] > 0
    assert (run / "cache" / "measure_subset_n64_seed0.pt").is_file()
    code, _, err = sam_eval(run, *MEASURE, "eval.device=cpu")
    assert code == 0, err
    ev = json.loads((run / "eval.json").read_text())
    assert ev["status"] == "completed", ev.get("error")
    assert ev["lambda_max"] == pytest.approx(row["lambda_max"], rel=1e-3)
    assert ev["test_acc"] == pytest.approx(row["test_acc"], abs=1e-6)
    assert ev["test_loss"] == pytest.approx(row["test_loss"], rel=1e-5)
    # whole sets directly: every file through the evaluation transform, the loaded model
    loaded = RunDir(run).load(torch.device("cpu"))
    for split, key in (("train", "train_acc"), ("val", "test_acc")):
        ds = loaded.data.train_plain.ds.ds if split == "train" else loaded.data.test.ds.ds
        x = torch.stack([ds[i][0] for i in range(len(ds))])
        y = torch.tensor([ds[i][1] for i in range(len(ds))])
        with torch.no_grad():
            acc = float((loaded.model(x).argmax(1) == y).float().mean())
        assert ev[key] == pytest.approx(acc, abs=1e-6)


def test_the_subset_is_the_same_in_training_sam_eval_and_sam_landscape():
    run = trained(0)
    cached = torch.load(run / "cache" / "measure_subset_n64_seed0.pt", weights_only=True)["x"]
    loaded = RunDir(run).load(torch.device("cpu"))
    fresh = loaded.data.folder_subset(64, 0)[0]  # decoded again, no cache
    assert torch.equal(cached, fresh)
    x, _ = loaded.train_subset(64)  # what sam-eval's tracker and sam-landscape's evaluator get
    assert torch.equal(x, loaded.data.prepare(cached, None))


def test_landscape_slices_and_the_pair_on_folder_runs(tmp_path):
    from sam_runner.landscape.cli import main

    a = Path(shutil.copytree(trained(0), tmp_path / "a"))
    b = trained(1)
    quiet = ["--progress", "none", "--device", "cpu"]
    assert main([str(a), "--points", "5", "--grid", "3", *quiet]) == 0
    s = json.loads((a / "landscape" / "landscape.json").read_text())
    # the run's measurement subset and its whole test set (3 classes x 10 images)
    assert (s["train_samples"], s["test_samples"]) == (64, 30)
    argv = [str(a), "--to", str(b), "--alphas", "3", "--bn", "recompute", "--bn-samples", "48"]
    assert main([*argv, *quiet]) == 0
    pair = json.loads((a / "landscape" / b.name / "landscape.json").read_text())
    assert (pair["train_samples"], pair["test_samples"]) == (64, 30)


def test_bad_trees_stop_sam_run_before_anything_is_written(tmp_path):
    root = write_tree(tmp_path / "t", per_class=8, val_per_class=1)
    (root / "train" / "ant" / "0.png").write_bytes(b"broken")
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", *folder_args(root), f"hydra.run.dir={run}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "0.png is unreadable" in lines[0]
    assert not (run / "metrics.jsonl").exists() and not (run / "cache").exists()
    assert not (run / "checkpoints").exists()
