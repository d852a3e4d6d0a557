"""Between two runs: the straight line, its barrier, BatchNorm reset, the Bézier curve."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from landscape_helpers import CNN, MLP, copy_run, trained

from sam_runner.landscape.cli import main
from sam_runner.landscape.evaluate import COLUMNS
from sam_runner.landscape.files import pair_folder
from sam_runner.runfiles import read_rows

QUIET = ["--progress", "none"]


def table(path):
    with open(path) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def last_test(run):
    return [r for r in read_rows(run / "metrics.jsonl") if "test_loss" in r][-1]


def test_a_run_with_itself_is_flat_and_its_barrier_is_zero(tmp_path):
    run = copy_run(trained(*CNN), tmp_path / "run")
    assert main([str(run), "--to", str(run), "--alphas", "7", *QUIET]) == 0
    out = run / "landscape" / run.name
    rows = table(out / "connectivity.csv")
    assert [r["alpha"] for r in rows] == pytest.approx([-0.25, 0, 0.25, 0.5, 0.75, 1, 1.25])
    for k in COLUMNS:  # every point is the run itself, bit for bit
        assert len({r[k] for r in rows}) == 1
    s = json.loads((out / "landscape.json").read_text())
    for key in ("train_loss", "test_loss", "train_error", "test_error"):
        assert s[f"barrier_{key}"] == 0.0
    assert s["ends"]["a"]["test_loss"] == last_test(run)["test_loss"]


def test_the_ends_are_the_two_runs_own_losses_and_the_barrier_is_their_rise(tmp_path):
    a = copy_run(trained(*CNN), tmp_path / "a")
    b = trained(*CNN, "seed=1")
    assert main([str(a), "--to", str(b), *QUIET]) == 0
    out = a / "landscape" / b.name
    rows = table(out / "connectivity.csv")
    alphas = np.array([r["alpha"] for r in rows])
    assert len(rows) == 31 and {0.0, 0.5, 1.0} <= set(alphas)
    at = {r["alpha"]: r for r in rows}
    for run, alpha in ((a, 0.0), (b, 1.0)):  # the test set: what each run logged itself
        assert at[alpha]["test_loss"] == last_test(run)["test_loss"]
        assert at[alpha]["test_acc"] == last_test(run)["test_acc"]
    s = json.loads((out / "landscape.json").read_text())
    inside = [r for r in rows if 0 <= r["alpha"] <= 1]
    lo, hi = at[0.0]["train_loss"], at[1.0]["train_loss"]
    rise = max(r["train_loss"] - (lo + r["alpha"] * (hi - lo)) for r in inside)
    assert s["barrier_train_loss"] == pytest.approx(rise, abs=1e-12)
    assert s["run_b"]["run"] == str(b.resolve()) and s["settings"]["bn"] == "eval"
    assert (out / "connectivity.png").read_bytes()[:4] == b"\x89PNG"


def test_batchnorm_recomputed_at_each_alpha(tmp_path):
    a = copy_run(trained(*CNN), tmp_path / "a")
    b = trained(*CNN, "seed=1")
    argv = [str(a), "--to", str(b), "--alphas", "5", "--bn", "recompute", "--bn-samples", "128"]
    assert main([*argv, *QUIET]) == 0
    s = json.loads((a / "landscape" / b.name / "landscape.json").read_text())
    assert s["settings"]["bn"] == "recompute" and s["settings"]["bn_samples"] == 128
    rows = table(a / "landscape" / b.name / "connectivity.csv")
    # statistics recomputed at α = 0 are not the run's running averages
    assert rows[1]["alpha"] == 0 and rows[1]["test_loss"] != last_test(a)["test_loss"]


def test_a_trained_bezier_curve_has_a_lower_mean_loss_than_the_straight_line(tmp_path):
    a = copy_run(trained(*MLP, "trainer.epochs=8"), tmp_path / "a")
    b = trained(*MLP, "trainer.epochs=8", "seed=1")
    argv = [str(a), "--to", str(b), "--curve", "bezier", "--curve-epochs", "4", "--alphas", "11"]
    assert main([*argv, *QUIET]) == 0
    out = pair_folder(a, b)
    s = json.loads((out / "landscape.json").read_text())
    curve = s["curve"]
    assert s["barrier_train_loss"] > 0  # two seeds: the straight line rises
    assert curve["mean_train_loss"] < curve["line_mean_train_loss"]
    assert curve["epochs"] == 4 and len(curve["epoch_train_loss"]) == 4
    line, bez = table(out / "connectivity.csv"), table(out / "bezier.csv")
    assert [r["t"] for r in bez] == [r["alpha"] for r in line if 0 <= r["alpha"] <= 1]
    ends = {r["alpha"]: r for r in line}
    assert bez[0]["train_loss"] == ends[0.0]["train_loss"]  # the curve starts at A ...
    assert bez[-1]["train_loss"] == ends[1.0]["train_loss"]  # ... and ends at B, exactly
