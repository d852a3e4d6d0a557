"""A run's own plots: training curves and reliability diagram, written at the end of a run."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, compose
from results_helpers import shared_sweep

from sam_runner.plots.run import (
    _epoch_axis,
    find_reliability,
    plot_curves,
    plot_reliability,
    write_run_plots,
)
from sam_runner.plots.style import save_figure, variant_color, variant_names
from sam_runner.plots.sweep import plot_acc_vs_lambda, plot_metric_vs_rho
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
        "panel": "",
        "variant": series.split()[0],
        "rho": rho,
        "stats": {"lambda_max": {"mean": mean, "std": 0.1 * mean, "n": 2}},
    }


def test_rho_zero_stays_on_a_wide_rho_axis(tmp_path):
    fig = plot_metric_vs_rho(
        [group("sam", r, 5.0 - r) for r in (0.0, 0.01, 0.2)], "lambda_max", "λ_max", logy=True
    )
    assert decodes(save_figure(fig, tmp_path, "p"))
    lo, hi = fig.axes[0].get_xlim()
    assert lo <= 0.0 and hi >= 0.2 and fig.axes[0].get_xscale() == "symlog"


def test_two_groups_of_one_line_at_the_same_rho_plot(tmp_path):
    fig = plot_metric_vs_rho(
        [group("sam", 0.1, 4.0), group("sam", 0.1, 5.0)], "lambda_max", "λ_max"
    )
    assert decodes(save_figure(fig, tmp_path, "p"))


def test_a_sweep_over_other_axes_gets_one_panel_per_combination_one_legend_outside(tmp_path):
    """batch size × lr besides ρ: four panels titled with their values, one line per variant in
    each, one figure legend right of the panels (each variant once, the bound once)."""
    groups = [
        dict(
            group(v, r, 5.0),
            panel=f"dataset.batch_size={b} base_optimizer.lr={lr}",
            bounds=[(r, 9.0)] if v == "sam" else [],
        )
        for v in ("sam", "gear_sam")
        for b in (128, 32)
        for lr in (0.2, 0.05)
        for r in (0.05, 0.2)
    ]
    fig = plot_metric_vs_rho(groups, "lambda_max", "λ_max", logy=True, bounds=True)
    save_figure(fig, tmp_path, "p")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in panels]
    assert len(panels) == 4  # numbers in order of value
    assert titles[0] == "dataset.batch_size=32 base_optimizer.lr=0.05"
    assert all(len(ax.get_lines()) >= 2 for ax in panels)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["gear_sam", "sam"] and len(labels) == 3
    assert labels[2].startswith("stability bound (bΓ/(2ρη²))^(1/3)")
    renderer = fig.canvas.get_renderer()
    box = fig.legends[0].get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in panels)
    assert fig.get_suptitle() and "ρ" in panels[0].get_xlabel()


def test_each_variant_has_one_colour_in_every_figure():
    """The same variant is drawn in the same colour in a ρ figure and the λ_max scatter, and
    variants differ from one another; base is black."""
    from matplotlib.colors import to_hex

    groups = [group(v, r, 3.0 + r) for v in ("gear_sam", "sam", "asam") for r in (0.05, 0.1)]
    rho_fig = plot_metric_vs_rho(groups, "lambda_max", "λ_max")
    scatter = plot_acc_vs_lambda([("sam", 3.0, 0.5), ("gear_sam", 4.0, 0.6), ("asam", 5.0, 0.7)])
    line_colors = {
        c.get_label(): to_hex(c.lines[0].get_color()) for c in rho_fig.axes[0].containers
    }
    dot_colors = {c.get_label(): to_hex(c.get_facecolor()[0]) for c in scatter.axes[0].collections}
    for v in ("gear_sam", "sam", "asam"):
        assert line_colors[v] == dot_colors[v] == to_hex(variant_color(v))
    assert (
        len({to_hex(variant_color(v)) for v in ("sam", "asam", "gear_sam", "tlc_sam", "gsam")}) == 5
    )
    assert to_hex(variant_color("base")) == "#000000"
    # every registered variant its own colour, none base's black (14-variant figures repeated two)
    names = [n for n in variant_names() if n != "base"]
    colours = {to_hex(variant_color(v)) for v in names}
    assert len(colours) == len(names) and "#000000" not in colours


def test_curves_have_integer_epochs_a_descriptive_title_and_a_single_lambda_as_text(tmp_path):
    rows = [
        {
            "epoch": e,
            "step": 10 * e,
            "train_loss": 1.0 / e,
            "train_acc": 0.5,
            "test_acc": 0.5,
            "test_ece": 0.1,
        }
        for e in (1, 2, 3)
    ]
    rows[-1]["lambda_max"] = 39.85
    summary = {
        "status": "completed",
        "epochs": 3,
        "model_built": "cnn1d",
        "config": {"dataset.name": "mnist1d", "optimizer.name": "sam", "optimizer.rho": 0.05},
    }
    write_rows(tmp_path, rows, summary)
    write_run_plots(tmp_path)
    fig = plot_curves(rows, "t")
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    # one λ_max is no curve: three panels, the value in the title (#58 item 9)
    assert len(fig.axes) == 3 and [a.get_title() for a in fig.axes][2].startswith("calibration")
    assert "λ_max = 39.85 (measured once, at epoch 3)" in fig.get_suptitle()
    rows[1]["lambda_max"] = 41.0
    assert len(plot_curves(rows, "t").axes) == 4  # measured twice: its curve
    from sam_runner.plots.run import run_title

    assert run_title(summary) == "mnist1d · cnn1d · sam (ρ = 0.05) · 3 epochs"


def test_reliability_diagram_has_a_count_histogram_and_a_gap_colour_matching_its_legend():
    from matplotlib.colors import to_rgb

    bins = {"confidence": [0.1, 0.5, 0.95], "accuracy": [0.0, 0.4, 1.0], "count": [3, 0, 700]}
    fig = plot_reliability(bins, "r")
    diagram, hist = fig.axes
    legend = {
        t.get_text(): h
        for t, h in zip(diagram.get_legend().get_texts(), diagram.get_legend().legend_handles)
    }
    gap_bars = [p for p in diagram.patches if to_rgb(p.get_edgecolor()) == to_rgb("tab:red")]
    assert gap_bars and all(not p.get_hatch() and not p.get_fill() for p in gap_bars)
    handle = legend["gap to mean confidence"]  # drawn as the bars are: a red outline
    assert to_rgb(handle.get_edgecolor()) == to_rgb("tab:red") and not handle.get_fill()
    assert [round(p.get_height()) for p in hist.patches] == [3, 0, 700]
    assert hist.get_yscale() == "log" and hist.get_ylabel() == "samples"


def test_step_level_curvature_is_drawn_against_the_step_with_its_labelled_threshold(tmp_path):
    rows = [
        {
            "epoch": s,
            "step": s,
            "lambda_max": 2.0 + 0.1 * s,
            "eos_threshold": 10.0,
            "eos_ratio": (2.0 + 0.1 * s) / 10,
            "step_loss": 1.0 / s,
        }
        for s in range(10, 100, 10)
    ]
    rows.append(
        {
            "epoch": 90,
            "step": 90,
            "train_loss": 0.1,
            "train_acc": 0.9,
            "test_loss": 0.2,
            "test_acc": 0.8,
            "test_ece": 0.05,
            "lambda_max": 11.0,
        }
    )
    write_rows(
        tmp_path,
        rows,
        {"status": "completed", "config": {"trainer.steps": 90, "base_optimizer.lr": 0.2}},
    )
    from sam_runner.plots.run import plot_eos, run_title, step_curvature

    assert step_curvature(rows)
    fig = plot_eos(rows, "t")
    top, bottom = fig.axes
    labels = top.get_legend_handles_labels()[1]
    assert labels == ["λ_max", "stability threshold (2/η for GD) = 10"]
    assert top.get_lines()[1].get_linestyle() == "--" and bottom.get_xlabel() == "step"
    assert "90 steps, η = 0.2" in run_title(
        {"config": {"trainer.steps": 90, "base_optimizer.lr": 0.2}}
    )
    assert decodes(write_run_plots(tmp_path)[0])


def test_sweep_eos_traces_draw_each_threshold_dashed_and_the_sam_edge_dotted():
    from types import SimpleNamespace

    from sam_runner.plots.sweep import plot_eos_traces

    def job(variant, lr):
        return SimpleNamespace(
            variant=variant, lr=lr, overrides=[f"optimizer={variant}", f"base_optimizer.lr={lr}"]
        )

    steps = [10, 20, 30]
    traces = [
        {
            "job": job(v, lr),
            "steps": steps,
            "lambda_max": [1.0, 2.0, 2.0 / lr],
            "threshold": [2.0 / lr] * 3,
            "sam_edge": [0.5 / lr] * 3 if v == "sam" else [None] * 3,
        }
        for v in ("base", "sam")
        for lr in (0.1, 0.2)
    ]
    fig = plot_eos_traces(traces)
    base, sam = (ax for ax in fig.axes if ax.get_visible() and ax.get_title())
    assert (base.get_title(), sam.get_title()) == ("base", "sam")
    styles = lambda ax: sorted(line.get_linestyle() for line in ax.get_lines())  # noqa: E731
    assert styles(base) == ["-", "-", "--", "--"]
    assert styles(sam) == ["-", "-", "--", "--", ":", ":"]
    dotted = [line for line in sam.get_lines() if line.get_linestyle() == ":"]
    assert sorted(float(line.get_ydata()[0]) for line in dotted) == [2.5, 5.0]
    assert "dotted: the SAM edge" in fig._suptitle.get_text()


# ------------------------------------------------------------ paper figures (#28)
def test_one_rho_gets_one_readable_tick_and_the_legend_leaves_the_panel_its_width():
    """A sweep at one ρ (sam with its bound, base as a level): the ρ axis has one tick, at that ρ,
    the legend sits under the panel (not beside it) and its title says what bars and bands are."""
    groups = [
        dict(group("sam", 0.05, 50.0), bounds=[(0.05, 45.0), (0.05, 47.0)]),
        group("base", None, 88.0),
    ]
    fig = plot_metric_vs_rho(groups, "lambda_max", "λ_max", logy=True, bounds=True)
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.get_visible()]
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels == ["0.05"]
    renderer = fig.canvas.get_renderer()
    legend, panel = fig.legends[0].get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= panel.y0 and panel.width > 0.6 * fig.bbox.width
    assert "± 1 sample std" in fig.legends[0].get_title().get_text()


def test_every_figure_is_written_as_png_pdf_or_svg_and_nothing_else(tmp_path):
    import pytest

    from sam_runner.errors import UserError

    fig = plot_acc_vs_lambda([("sam", 3.0, 0.5), ("base", 4.0, 0.6)])
    heads = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}
    for fmt, head in heads.items():
        path = save_figure(fig, tmp_path, "f", fmt)
        assert path.name == f"f.{fmt}" and path.read_bytes()[:5].startswith(head)
    first = (tmp_path / "f.pdf").read_bytes()  # no creation date: the same figure, the same file
    assert save_figure(fig, tmp_path, "f", "pdf").read_bytes() == first
    accepted = "choose one of png, pdf, svg"
    with pytest.raises(UserError, match=f"plots.format='eps' is unknown; {accepted}"):
        save_figure(fig, tmp_path, "g", "eps")
    assert not list(tmp_path.glob("g.*"))


def test_a_run_is_titled_by_what_it_is_not_by_its_folder_name():
    from sam_runner.rundir import run_label

    long = "/x/multirun/optimizer-sam+base__optimizer.rho-0.05__seed-0+1__trainer.epochs-3"
    job = {"run": f"{long}/3", "variant": "sam", "rho": 0.05, "seed": 1}
    assert run_label(job) == "job 3 (sam, ρ = 0.05, seed 1)"
    assert run_label({"run": long, "variant": "base", "rho": None, "seed": 0}) == "base, seed 0"


@pytest.mark.parametrize(
    "means",
    [(28.3, 41.0, 59.46), (41.0, 5000.0), (0.37, 3.1, 700.0), (0.004, 0.3, 25.0, 9e4), (7.9, 8.3)],
)
def test_a_log_axis_has_a_tick_below_the_lowest_point_and_above_the_highest(means):
    """lambda_max_vs_rho.png: every point lies between two labelled ticks (#42: a point below
    the lowest tick could not be read), and the ticks are few enough to read."""
    rhos = (0.01, 0.05, 0.1, 0.2)
    fig = plot_metric_vs_rho(
        [group("sam", r, m) for r, m in zip(rhos, means)], "lambda_max", "λ_max", logy=True
    )
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if low <= t <= high]  # the ticks drawn
    assert ticks[0] <= min(means) and ticks[-1] >= max(means), (ticks, means)
    assert 2 <= len(ticks) <= 9 and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
    assert all(label and "×" not in label and "^" not in label for label in labels), labels


def test_variants_at_the_same_rho_are_set_apart_so_their_bars_do_not_hide_each_other():
    """#58 item 9: sam and gear_sam at one ρ sat at one x, one error bar over the other."""
    groups = [group("sam", r, 4.0) for r in (0.05, 0.1)]
    groups += [group("gear_sam", r, 4.0) for r in (0.05, 0.1)]
    fig = plot_metric_vs_rho(groups, "lambda_max", "λ_max")
    fig.canvas.draw()
    ax = fig.axes[0]
    lines = [c.lines[0] for c in ax.containers if c.get_label() in ("sam", "gear_sam")]
    assert len(lines) == 2
    x = [line.get_transform().transform(line.get_xydata())[:, 0] for line in lines]
    gap = abs(x[0] - x[1])  # display pixels, at each ρ
    assert (gap > 5).all()
    assert [float(t) for t in ax.get_xticks()] == [0.05, 0.1]  # the ticks stay at the values


def test_a_catalogue_of_variants_each_at_its_own_rho_is_drawn_on_its_rho_and_in_view():
    """The baselines preset: each variant at its published ρ beside a base level. Every point
    lies inside the axes (the shifted points reach autoscale) and a variant alone at its ρ sits
    on it (no sideways shift); those sharing a ρ are still set apart."""
    groups = [dict(group("base", None, 50.0), rho=None)]
    groups += [group(v, r, m) for v, r, m in (
        ("bsam", 0.01, 11.0), ("sam", 0.05, 40.0), ("wsam", 0.05, 39.0), ("asam", 0.5, 36.0),
    )]  # fmt: skip
    fig = plot_metric_vs_rho(groups, "lambda_max", "λ_max", logy=True)
    fig.canvas.draw()
    ax = fig.axes[0]
    box = ax.get_window_extent()
    at = {}
    for c in ax.containers:
        line = c.lines[0]
        x, y = line.get_transform().transform(line.get_xydata())[0]  # where it is shown
        dx = ax.transData.transform(line.get_xydata())[0][0]  # where its ρ is
        assert box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1, c.get_label()
        at[c.get_label()] = x - dx
    assert at["bsam"] == pytest.approx(0) and at["asam"] == pytest.approx(0)
    assert abs(at["sam"] - at["wsam"]) > 5


@pytest.mark.parametrize("n_measures", [2, 5, 15])
def test_the_measures_grid_keeps_titles_labels_and_legend_apart(n_measures):
    """measures.png's panels on a fixed grid (no layout engine): no panel's title, tick labels
    or axis labels run into another panel's, the legend lies beside the grid, and the canvas
    holds it all (saved without the tight crop) with no wide blank margin."""
    from matplotlib.text import Text

    from sam_runner.plots.ranking import plot_measures
    from sam_runner.results.measure_ranking import Point, Table, label

    keys = ["lambda_max", "hessian_trace", "sharpness_worst", "path_norm", "fisher_trace_ratio"]
    keys = [keys[i % len(keys)] for i in range(n_measures)]
    values = lambda i: (
        {k: 10.0 ** ((i * 7 % 30) / 10 - 1) for k in keys}
        | {  # noqa: E731
            "gen_gap": (i * 0.37) % 0.2
        }
    )
    variants = ["sam", "gear_sam", "base"] * 20
    points = [Point(f"j{i}", v, {}, values(i), "eval.json") for i, v in enumerate(variants)]
    rows = [{"measure": k, "tau_gen_gap": 0.5, "psi": float("nan")} for k in keys]
    fig = plot_measures(Table(points, [], rows), label)
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    boxes = [ax.get_tightbbox(renderer) for ax in panels]  # title, ticks and labels included
    for i, a in enumerate(boxes):
        assert not any(a.overlaps(b) for b in boxes[i + 1 :])
    legend = fig.legends[0].get_window_extent(renderer)
    assert not any(legend.overlaps(b) for b in boxes)
    (title,) = [t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle()]
    assert title.get_window_extent(renderer).y0 > max(b.y1 for b in boxes)
    assert fig.get_layout_engine() is None
    drawn, canvas = fig.get_tightbbox(renderer), fig.bbox_inches  # inches
    assert canvas.x0 <= drawn.x0 and drawn.x1 <= canvas.x1
    assert canvas.y0 <= drawn.y0 and drawn.y1 <= canvas.y1
    assert canvas.width - drawn.width < 0.5 and canvas.height - drawn.height < 0.5
    assert fig.sam_runner_fits_canvas  # so save_figure does not crop it
