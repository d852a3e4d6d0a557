"""The α-skew JSD part of ``sam-report`` (the ``jsd_vs_sam`` presets): λ_max and the Fisher trace
ratio against the JSD's local curvature coefficient α(1−α), one line per SAM variant, as
``jsd.png`` and a table in report.md.

The points are the completed jobs with ``regularizer=jsd`` and a weight > 0: per variant and α the
mean ± std over seeds of ``lambda_max`` and ``fisher_trace_ratio`` (Σ H_ii/(F_ii + δ), the Fisher
measure our metrics compute: ``metrics.sharpness.fisher_trace_ratio.enabled=true`` in training or
sam-eval ``metrics=full``); the numbers are eval.json's when sam-eval measured the job, else the
training's (``measure_ranking.job_values``). The jobs of weight 0 (the same variant without the
regularizer) are each variant's reference, a dashed line. Present when the jobs hold two α or more.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..runfiles import finite
from .measure_ranking import job_values
from .sections import SECTIONS, figure
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from .sweep import Report

KEYS = {"lambda_max": "λ_max", "fisher_trace_ratio": "Fisher trace ratio"}
STEM = "jsd"


def jsd_points(report: Report) -> dict | None:
    """{"rows": {(variant, α): {key: stats}}, "reference": {variant: {key: stats}}, "keys": the
    KEYS some job has}; None with fewer than two α."""
    by_alpha: dict = {}
    plain: dict = {}
    for job in report.completed():
        if job.run.get("regularizer.name") != "jsd":
            continue
        alpha, weight = job.run.get("regularizer.alpha"), job.run.get("regularizer.weight")
        if not (finite(alpha) and finite(weight)):
            continue
        values = job_values(job.run)[0]
        target = plain.setdefault(job.variant, []) if weight == 0 else None
        if target is None:
            target = by_alpha.setdefault((job.variant, float(alpha)), [])
        target.append(values)
    if len({a for _, a in by_alpha}) < 2:
        return None
    keys = [k for k in KEYS if any(k in v for vs in by_alpha.values() for v in vs)]
    summarize = lambda vs: {k: stats([v.get(k) for v in vs]) for k in keys}  # noqa: E731
    return {
        "rows": {k: summarize(vs) for k, vs in sorted(by_alpha.items())},
        "reference": {variant: summarize(vs) for variant, vs in plain.items()},
        "keys": keys,
    }


def write_jsd(report: Report, out_dir: Path) -> list[Path]:
    """The figure of λ_max and the Fisher trace ratio against α(1−α), with two α or more."""
    points = jsd_points(report)
    if points is None or not points["keys"]:
        return []
    from ..plots.cache import save_plot
    from ..plots.jsd import plot_jsd

    shown = {k: KEYS[k] for k in points["keys"]}
    return [save_plot(out_dir, STEM, report.plot_format, plot_jsd, points, shown)]


@SECTIONS.register(
    "jsd", "λ_max and the Fisher trace ratio against α(1−α)", order=45, files=write_jsd
)
def jsd_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's JSD section: λ_max and the Fisher trace ratio against α(1−α)."""
    points = jsd_points(report)
    if points is None or not points["keys"]:
        return []
    keys = points["keys"]
    head = ["variant", "α", "α(1−α)", *(KEYS[k] for k in keys), "n"]
    out = ["## α-skew JSD", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (variant, alpha), row in points["rows"].items():
        n = max(s["n"] for s in row.values())
        cells = [variant, f"{alpha:g}", f"{alpha * (1 - alpha):.4g}"]
        out.append("| " + " | ".join([*cells, *(stats_cell(row[k]) for k in keys), str(n)]) + " |")
    for variant, row in points["reference"].items():
        n = max((s["n"] for s in row.values()), default=0)
        cells = [variant, "no JSD", "—", *(stats_cell(row[k]) for k in keys), str(n)]
        out.append("| " + " | ".join(cells) + " |")
    return out + [
        "",
        figure(f"{STEM}.{report.plot_format}"),
        "",
        "Mean ± std over seeds of the jobs regularized by weight·JSD_α (regularizer=jsd, weight "
        "> 0); α and 1 − α share α(1−α), the JSD's local curvature coefficient (circles: α ≤ ½, "
        "squares: α > ½). The Fisher trace ratio is Σ H_ii/(F_ii + δ), F the diagonal "
        "empirical Fisher. Dashed: the variant without the regularizer (weight 0).",
        "",
    ]
