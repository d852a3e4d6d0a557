"""A run's own plots: training curves and reliability diagram, written at the end of a run."""
from __future__ import annotations

import json

from conftest import TINY, compose
from results_helpers import shared_sweep
from sam_runner.plots import _epoch_axis, find_reliability, write_run_plots
from sam_runner.train import train


def decodes(path) -> bool:
    from PIL import Image
    with Image.open(path) as im:
        im.load()
        return im.format == "PNG" and min(im.size) > 100


def write_rows(run_dir, rows, summary=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))


def test_every_run_of_a_sweep_leaves_its_curves():
    jobs = sorted(p for p in shared_sweep().iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        assert decodes(job / "curves.png")
        if find_reliability(json.loads((job / "summary.json").read_text())) or \
                any(find_reliability(json.loads(line)) for line in (job / "metrics.jsonl").read_text().splitlines()):
            assert decodes(job / "reliability.png")


def test_reliability_diagram_from_the_summary_bins_and_none_without_them(tmp_path):
    rows = [{"epoch": 1, "step": 5, "train_loss": 1.0, "train_acc": 0.5, "test_acc": 0.5, "test_ece": 0.1}]
    bins = {"confidence": [0.1, 0.5, 0.9], "accuracy": [0.0, 0.4, 1.0], "count": [3, 0, 7]}
    write_rows(tmp_path / "with", rows, {"status": "completed", "test_ece": 0.1, "calibration": {"test": bins}})
    assert [p.name for p in write_run_plots(tmp_path / "with")] == ["curves.png", "reliability.png"]
    assert decodes(tmp_path / "with" / "reliability.png")
    write_rows(tmp_path / "without", rows, {"status": "completed"})
    assert [p.name for p in write_run_plots(tmp_path / "without")] == ["curves.png"]


def test_diverged_values_and_mid_epoch_curvature_rows_are_drawn(tmp_path):
    rows = [{"epoch": 1, "step": 4, "lambda_max": 2.0},
            {"epoch": 1, "step": 8, "train_loss": 2.0, "train_acc": 0.3, "test_acc": 0.3, "lambda_max": 3.0},
            {"epoch": 2, "step": 12, "lambda_max": None},
            {"epoch": 2, "step": 16, "train_loss": float("nan"), "train_acc": 0.1, "test_acc": None}]
    assert _epoch_axis(rows) == [0.5, 1, 1.5, 2]  # a mid-epoch row at its fractional epoch
    write_rows(tmp_path, rows, {"status": "diverged"})
    (tmp_path / "metrics.jsonl").write_text((tmp_path / "metrics.jsonl").read_text() + '{"epoch": 3, "st')  # a cut line
    assert decodes(write_run_plots(tmp_path)[0])


def test_a_run_without_metrics_writes_no_plots(tmp_path):
    assert write_run_plots(tmp_path) == []


def test_a_plotting_failure_never_fails_the_run(tmp_path, capsys):
    (tmp_path / "curves.png").mkdir()  # the plot cannot be written there
    summary = train(compose(*TINY, "trainer.epochs=1", "metrics.hessian.enabled=false"), tmp_path)
    assert summary["status"] == "completed"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    assert "run plots not written" in capsys.readouterr().err
