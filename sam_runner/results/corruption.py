"""Robustness to corruptions in ``sam-report``: the mCE table (a section of report.md), when the
jobs have corruption accuracies (``metrics.corruptions``, from sam-eval or training) and the
sources have completed ``base`` jobs (the reference model).

mCE: each corruption's error relative to the mean error of the completed ``base`` jobs (the
reference model of Hendrycks & Dietterich 2019's CE), averaged over corruptions, in %.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from ..runfiles import finite
from .measure_ranking import CORRUPTION_PREFIX, Point, measures_table
from .sections import SECTIONS
from .sweep import group_overrides

if TYPE_CHECKING:
    from pathlib import Path

    from .sweep import Report


def mce_rows(report: Report, points: list[Point]) -> list[tuple[str, float, float | None, int]]:
    """(group, mean mCE %, its sample std, n) per group of the jobs with corruption accuracies,
    relative to the mean corruption errors of the completed base jobs; [] without base jobs."""
    names = sorted({k for p in points for k in p.values if k.startswith(CORRUPTION_PREFIX)})
    base = [p for p in points if p.variant == "base"]
    ref = {
        c: statistics.fmean([1 - p.values[c] for p in base if c in p.values] or [math.nan])
        for c in names
    }
    names = [c for c in names if finite(ref[c]) and ref[c] > 0]
    if not names or not base:
        return []
    by_group: dict = {}
    for p, job in _completed(report, points):
        if all(c in p.values for c in names):
            mce = 100 * statistics.fmean((1 - p.values[c]) / ref[c] for c in names)
            by_group.setdefault(
                " ".join(group_overrides(job.overrides)) or "(defaults)", []
            ).append(mce)
    return [
        (g, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else None, len(v))
        for g, v in by_group.items()
    ]


def _completed(report, points):
    by_name = {p.name: p for p in points}
    for job in report.jobs:
        if job.path is not None and job.status == "completed":
            p = by_name.get(job.name)
            if p is not None:
                yield p, job


@SECTIONS.register("corruption", "mCE relative to the base jobs", order=20)
def section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's corruption section: mCE relative to the base jobs."""
    table = measures_table(report)  # the jobs the measures section ranks
    return [] if table is None else _mce_lines(report, table.points)


def _mce_lines(report, points) -> list[str]:
    rows = mce_rows(report, points)
    if not rows:
        return []
    out = [
        "mCE (%): each corruption's error relative to the mean error of the sweep's base jobs, "
        "averaged over corruptions (100 = as robust as base); mean ± std over seeds.",
        "",
        "| group | mCE | n |",
        "|---|---|---|",
    ]
    labels = {g["group"]: g["label"] for g in report.groups}  # without the shared overrides
    order = {g["group"]: i for i, g in enumerate(report.groups)}
    for group, mean, std, n in sorted(rows, key=lambda r: order.get(r[0], len(order))):
        cell = f"{mean:.1f}" + (f" ± {std:.1f}" if std is not None else "")
        out.append(f"| {labels.get(group, group)} | {cell} | {n} |")
    return out + [""]
