"""A run's own plots: training curves and reliability diagram, written at the end of a run."""

from __future__ import annotations

import json

from conftest import TINY, compose
from results_helpers import shared_sweep

from sam_runner.plots import (
    _epoch_axis,
    find_reliability,
    plot_metric_vs_rho,
    save_png,
    write_run_plots,
)
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
        if find_reliability(json.loads((job / "summary.json").read_text())) or any(
            find_reliability(json.loads(line))
            for line in (job / "metrics.jsonl").read_text().splitlines()
        ):
            assert decodes(job / "reliability.png")


def test_reliability_diagram_from_the_summary_bins_and_none_without_them(tmp_path):
    rows = [
        {
            "epoch": 1,
            "step": 5,
            "train_loss": 1.0,
            "train_acc": 0.5,
            "test_acc": 0.5,
            "test_ece": 0.1,
        }
    ]
    bins = {"confidence": [0.1, 0.5, 0.9], "accuracy": [0.0, 0.4, 1.0], "count": [3, 0, 7]}
    write_rows(
        tmp_path / "with",
        rows,
        {"status": "completed", "test_ece": 0.1, "calibration": {"test": bins}},
    )
    assert [p.name for p in write_run_plots(tmp_path / "with")] == ["curves.png", "reliability.png"]
    assert decodes(tmp_path / "with" / "reliability.png")
    write_rows(tmp_path / "without", rows, {"status": "completed"})
    assert [p.name for p in write_run_plots(tmp_path / "without")] == ["curves.png"]


def test_diverged_values_and_mid_epoch_curvature_rows_are_drawn(tmp_path):
    rows = [
        {"epoch": 1, "step": 4, "lambda_max": 2.0},
        {
            "epoch": 1,
            "step": 8,
            "train_loss": 2.0,
            "train_acc": 0.3,
            "test_acc": 0.3,
            "lambda_max": 3.0,
        },
        {"epoch": 2, "step": 12, "lambda_max": None},
        {"epoch": 2, "step": 16, "train_loss": float("nan"), "train_acc": 0.1, "test_acc": None},
    ]
    assert _epoch_axis(rows) == [0.5, 1, 1.5, 2]  # a mid-epoch row at its fractional epoch
    write_rows(tmp_path, rows, {"status": "diverged"})
    # a cut line
    (tmp_path / "metrics.jsonl").write_text(
        (tmp_path / "metrics.jsonl").read_text() + '{"epoch": 3, "st'
    )
    assert decodes(write_run_plots(tmp_path)[0])


def test_a_run_without_metrics_writes_no_plots(tmp_path):
    assert write_run_plots(tmp_path) == []


def test_a_plotting_failure_never_fails_the_run(tmp_path, capsys):
    (tmp_path / "curves.png").mkdir()  # the plot cannot be written there
    summary = train(compose(*TINY, "trainer.epochs=1", "metrics.hessian.enabled=false"), tmp_path)
    assert summary["status"] == "completed"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    assert "run plots not written" in capsys.readouterr().err


def group(series, rho, mean):
    """A sam-report group as plot_metric_vs_rho takes it."""
    return {
        "series": series,
        "variant": series.split()[0],
        "rho": rho,
        "stats": {"lambda_max": {"mean": mean, "std": 0.1 * mean, "n": 2}},
    }


def test_rho_zero_stays_on_a_wide_rho_axis(tmp_path):
    fig = plot_metric_vs_rho(
        [group("sam", r, 5.0 - r) for r in (0.0, 0.01, 0.2)], "lambda_max", "λ_max", logy=True
    )
    assert decodes(save_png(fig, tmp_path / "p.png"))
    lo, hi = fig.axes[0].get_xlim()
    assert lo <= 0.0 and hi >= 0.2 and fig.axes[0].get_xscale() == "symlog"


def test_two_groups_of_one_line_at_the_same_rho_plot(tmp_path):
    fig = plot_metric_vs_rho(
        [group("sam", 0.1, 4.0), group("sam", 0.1, 5.0)], "lambda_max", "λ_max"
    )
    assert decodes(save_png(fig, tmp_path / "p.png"))


def test_the_legend_stands_outside_the_axes_with_one_bound_entry(tmp_path):
    groups = [
        group(f"sam dataset.batch_size={b} base_optimizer.lr={lr}", r, 5.0)
        for b in (128, 32)
        for lr in (0.2, 0.05)
        for r in (0.05, 0.2)
    ]
    bounds = {g["series"]: [(g["rho"], 9.0)] for g in groups}
    fig = plot_metric_vs_rho(groups, "lambda_max", "λ_max", logy=True, bounds=bounds)
    save_png(fig, tmp_path / "p.png")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == 5 and sum("stability bound" in t for t in labels) == 1
    # numbers in order of value (lines first)
    assert labels[1] == "sam dataset.batch_size=32 base_optimizer.lr=0.05"
    renderer = fig.canvas.get_renderer()
    box = ax.get_legend().get_window_extent(renderer)
    assert not box.overlaps(ax.get_window_extent(renderer))
    assert (
        fig.bbox.x0 <= box.x0
        and box.x1 <= fig.bbox.x1
        and fig.bbox.y0 <= box.y0
        and box.y1 <= fig.bbox.y1
    )
