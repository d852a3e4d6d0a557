"""The sharpness dimension in ``sam-report``: when completed jobs carry ``sharpness_dim``
(``metrics.sharpness_dim``, from sam-eval or training), ``sharpness_dim.<format>`` — the
dimension against the step size η (``base_optimizer.lr``; one line per batch size and variant,
the mean over seeds) and against the generalization gap (one point per job) — and a section
of report.md with the figure and the Kendall τ of the dimension with the gap.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ..plots.style import natural_key
from ..runfiles import finite
from .measure_ranking import kendall_tau, points_of
from .sections import SECTIONS
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .measure_ranking import Point
    from .sweep import Report

KEY = "sharpness_dim"


def _points(report) -> list:
    return [p for p in points_of(report) if finite(p.values.get(KEY))]


def lines_by_step(points: Iterable[Point]) -> dict:
    """{(variant, batch size): [(η, mean dimension, jobs), ...] by η}, for jobs with an η."""
    cells: dict = {}
    for p in points:
        lr = p.settings.get("base_optimizer.lr")
        try:
            eta = float(lr)
        except (TypeError, ValueError):
            continue
        series = (p.variant, p.settings.get("dataset.batch_size", "—"))
        cells.setdefault(series, {}).setdefault(eta, []).append(p.values[KEY])
    return {
        s: [(eta, statistics.fmean(v), len(v)) for eta, v in sorted(by_eta.items())]
        for s, by_eta in sorted(
            cells.items(), key=lambda kv: (kv[0][0], natural_key(str(kv[0][1])))
        )
    }


def table(points: Iterable[Point]) -> list[str]:
    """report.md's table: per (variant, batch size, η), the dimension beside the number of
    parameters (its upper bound), the gap and λ_max, mean ± std over seeds."""
    cells: dict = {}
    for p in points:
        lr = p.settings.get("base_optimizer.lr")
        key = (p.variant, str(p.settings.get("dataset.batch_size", "—")), lr)
        cells.setdefault(key, []).append(p)
    order = sorted(cells, key=lambda k: (k[0], natural_key(k[1]), natural_key(str(k[2]))))
    cols = (KEY, "parameters", "gen_gap", "lambda_max")
    head = "| variant | batch size | η | sharpness dimension | parameters | gen. gap | λ_max | n |"
    out = [head, "|" + "---|" * 8]
    for variant, batch, lr in order:
        jobs = cells[(variant, batch, lr)]
        row = [stats_cell(stats([p.values.get(c) for p in jobs])) for c in cols]
        out.append(f"| {variant} | {batch} | {lr if lr is not None else '—'} | ")
        out[-1] += " | ".join(row) + f" | {len(jobs)} |"
    return out


def write_figure(report: Report, out_dir: Path) -> list[Path]:
    """sharpness_dim.<fmt>: the dimension against η per (variant, batch size), when jobs measured
    it."""
    points = _points(report)
    if not points:
        return []
    from ..plots.cache import save_plot
    from ..plots.sharpness_dim import plot_sharpness_dim

    drawn = (plot_sharpness_dim, lines_by_step(points), points, KEY)
    return [save_plot(out_dir, "sharpness_dim", report.plot_format, *drawn)]


@SECTIONS.register(
    "sharpness_dim", "the sharpness dimension against η and the gap", order=14, files=write_figure
)
def section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's sharpness-dimension section: its table and τ against the generalization gap."""
    points = _points(report)
    if not points:
        return []
    pairs = [(p.values[KEY], p.gen_gap) for p in points if finite(p.gen_gap)]
    tau = kendall_tau([a for a, _ in pairs], [b for _, b in pairs])
    said = f"{tau:+.3f} over {len(pairs)} jobs" if finite(tau) else "undefined (too few jobs)"
    return [
        "## Sharpness dimension",
        "",
        "The Kaplan–Yorke dimension of the optimizer's one-step map at each job's final weights "
        "(`sharpness_dim`), against the step size η (the mean over seeds; one line per variant "
        f"and batch size) and against the generalization gap. Kendall's τ with the gap: {said}.",
        "",
        f"![sharpness dimension](sharpness_dim.{report.plot_format})",
        "",
        *table(points),
        "",
        "Mean ± std over seeds; the dimension is at most the number of parameters (every "
        "direction expanding), and the gap is train − test accuracy.",
        "",
    ]
