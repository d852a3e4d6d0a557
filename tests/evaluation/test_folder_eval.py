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

from sam_runner.rebuild import load_run

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
    code, _, err = sam_eval(run, *MEASURE, "trainer.device=cpu")
    assert code == 0, err
    ev = json.loads((run / "eval.json").read_text())
    assert ev["status"] == "completed", ev.get("error")
    assert ev["lambda_max"] == pytest.approx(row["lambda_max"], rel=1e-3)
    assert ev["test_acc"] == pytest.approx(row["test_acc"], abs=1e-6)
    assert ev["test_loss"] == pytest.approx(row["test_loss"], rel=1e-5)
    # whole sets directly: every file through the evaluation transform, the loaded model
    loaded = load_run(run, torch.device("cpu"))
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
    loaded = load_run(run, torch.device("cpu"))
    fresh = loaded.data.folder_subset(64, 0)[0]  # decoded again, no cache
    assert torch.equal(cached, fresh)
    x, _ = loaded.train_subset(64)  # what sam-eval's tracker and sam-landscape's evaluator get
    assert torch.equal(x, loaded.data.prepare(cached, None))


def test_landscape_slices_and_the_pair_on_folder_runs(tmp_path):
    from sam_runner.landscape.cli import main

    a = Path(shutil.copytree(trained(0), tmp_path / "a"))
    b = trained(1)
    quiet = ["trainer.progress=none", "trainer.device=cpu"]
    assert main([str(a), "landscape.points=5", "landscape.grid=3", *quiet]) == 0
    s = json.loads((a / "landscape" / "landscape.json").read_text())
    # the run's measurement subset and its whole test set (3 classes x 10 images)
    assert (s["train_samples"], s["test_samples"]) == (64, 30)
    argv = [
        str(a),
        "--to",
        str(b),
        "landscape.alphas=3",
        "landscape.bn=recompute",
        "landscape.bn_samples=48",
    ]
    assert main([*argv, *quiet]) == 0
    pair = json.loads((a / "landscape" / b.name / "landscape.json").read_text())
    assert (pair["train_samples"], pair["test_samples"]) == (64, 30)


def test_the_landscape_keeps_its_batchnorm_subset_in_the_cache(tmp_path):
    """``bn=recompute``'s samples (the subset drawn with seed + 1) are decoded once into the
    run's cache, then read back from it, as the evaluated subset is."""
    from sam_runner.landscape.evaluate import Evaluator

    run = Path(shutil.copytree(trained(0), tmp_path / "run"))
    path = run / "cache" / "measure_subset_n48_seed1.pt"
    loaded = load_run(run, torch.device("cpu"))
    ev = Evaluator(loaded, 64, 32, bn="recompute", bn_samples=48)
    assert path.is_file()
    state = torch.load(path, weights_only=True)
    assert torch.equal(state["x"], loaded.data.folder_subset(48, 1)[0])  # as decoded, seed + 1
    assert torch.equal(torch.cat(ev.bn_inputs), loaded.data.prepare(state["x"], None))
    state["x"] = torch.zeros_like(state["x"])  # the cache, not the images, is read next time
    torch.save(state, path)
    again = Evaluator(load_run(run, torch.device("cpu")), 64, 32, "recompute", 48)
    zeros = loaded.data.prepare(torch.zeros_like(state["x"]), None)
    assert torch.equal(torch.cat(again.bn_inputs), zeros)


@pytest.mark.parametrize(
    "metrics", [pytest.param("metrics=default", marks=pytest.mark.slow), "metrics=off"]
)  # the curvature measure adds ~8 s, nothing to the path tested (CI's time)
def test_bad_images_stop_sam_run_with_workers_leaving_no_folder(tmp_path, metrics):
    """An unreadable image read by a DataLoader worker: one line naming it, exit 2, no run
    folder; found when the measurement subset is decoded, before training (metrics on), or by
    the training loader in the first epoch (metrics off: no subset)."""
    root = write_tree(tmp_path / "t", per_class=8, val_per_class=1)
    (root / "train" / "ant" / "0.png").write_bytes(b"broken")
    run = tmp_path / "run"
    args = [a for a in folder_args(root) if not a.startswith("dataset.num_workers")]
    args += ["dataset.num_workers=2", metrics, f"hydra.run.dir={run}"]
    proc = subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    # the error line (a notice may come first: OMP_NUM_THREADS=1 caps the workers at one)
    lines = [line for line in proc.stderr.splitlines() if ": error:" in line]
    assert lines == [
        f"sam-run: error: dataset.root: image {root / 'train' / 'ant' / '0.png'} is unreadable "
        "(UnidentifiedImageError); replace or remove it"
    ], proc.stderr[-2000:]
    assert not run.exists()
