"""How far sharpness and complexity jointly explain generalization (``sam-report``): for every
pair of a sharpness measure and a complexity measure the jobs carry, ``joint.csv`` (one row a
pair, ranked by ``r2``) and ``joint.<format>``, and a section of report.md.

Columns: ``sharpness``, ``complexity`` (the keys), ``r2`` (the least-squares fit of ``gen_gap`` on
both, with an intercept: 1 − SS_res/SS_tot), ``r2_sharpness`` and ``r2_complexity`` (each alone),
``n`` (the completed jobs with gen_gap and both measures), ``pareto_pairs`` (the job pairs in
which one job is strictly lower in both measures) and ``pareto_agreement`` (the share of those in
which that job also has the strictly lower gen_gap; empty without such pairs). A pair needs
``MIN_JOBS`` jobs (3): fewer, and the section says so instead (a notice, not an error); with fewer
than ``TRUST_JOBS`` (10) the section warns that three fitted numbers on so few jobs are not to be
trusted. Each job's numbers are the measure ranking's (eval.json when sam-eval measured it).
The sharpness side holds the curvature and sharpness measures and the input-gradient norm (a
sharpness in input space); the complexity side Jiang et al. 2020's norms.
"""

from __future__ import annotations

import csv
import io
import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from ..runfiles import finite
from .measure_ranking import label, points_of
from .sections import SECTIONS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .measure_ranking import Point
    from .sweep import Report

SHARPNESS = (
    "lambda_max",
    "hessian_trace",
    "sharpness_worst",
    "sharpness_avg",
    "sharpness_dir",
    "fisher_trace_ratio",
    "fisher_rao_norm",
    "sharpness_dim",
    "input_grad_norm",
)
COMPLEXITY = ("param_norm", "dist_from_init", "path_norm", "spectral_norm_product")
COLUMNS = (
    "sharpness",
    "complexity",
    "r2",
    "r2_sharpness",
    "r2_complexity",
    "n",
    "pareto_pairs",
    "pareto_agreement",
)
MIN_JOBS = 3
TRUST_JOBS = 10


def r_squared(columns: list, y: list) -> float:
    """R² of the least-squares fit of y on the columns and an intercept (NaN for constant y)."""
    import numpy as np

    X = np.column_stack([np.ones(len(y)), *[np.asarray(c, dtype=float) for c in columns]])
    Y = np.asarray(y, dtype=float)
    coef, *_ = np.linalg.lstsq(X, Y, rcond=None)
    total = float(((Y - Y.mean()) ** 2).sum())
    if total == 0:
        return float("nan")
    return 1.0 - float(((Y - X @ coef) ** 2).sum()) / total


def pareto_agreement(s: list, c: list, gap: list) -> tuple[int, float | None]:
    """(pairs where one job is lower in both measures, the share where it has the lower gap).
    Every ordered pair (a, b) with a strictly lower in both counts once (one of the two orders
    at most can be), compared as arrays, ``ROWS`` jobs' rows at a time."""
    import numpy as np

    s, c, g = (np.asarray(v, dtype=float) for v in (s, c, gap))
    pairs = agree = 0
    for start in range(0, len(g), ROWS):
        rows = slice(start, start + ROWS)
        lower = (s[rows, None] < s[None, :]) & (c[rows, None] < c[None, :])
        pairs += int(lower.sum())
        agree += int((lower & (g[rows, None] < g[None, :])).sum())
    return pairs, (agree / pairs if pairs else None)


ROWS = 1024  # pareto_agreement's block: 1024 × n booleans at a time


def joint_rows(points: Iterable[Point]) -> tuple[list[dict], int]:
    """The rows (ranked by r2, undefined last) and the largest n any pair had."""
    rows, most = [], 0
    usable = [p for p in points if finite(p.gen_gap)]
    # each measure's finite values once (None where not): not once per pair it is in
    column = {
        k: [v if finite(v := p.values.get(k)) else None for p in usable]
        for k in (*SHARPNESS, *COMPLEXITY)
    }
    for s_key, c_key in itertools.product(SHARPNESS, COMPLEXITY):
        triples = [
            (s, c, p.gen_gap)
            for s, c, p in zip(column[s_key], column[c_key], usable)
            if s is not None and c is not None
        ]
        most = max(most, len(triples))
        if len(triples) < MIN_JOBS:
            continue
        s, c, gap = (list(t) for t in zip(*triples))
        pairs, share = pareto_agreement(s, c, gap)
        rows.append(
            {
                "sharpness": s_key,
                "complexity": c_key,
                "r2": r_squared([s, c], gap),
                "r2_sharpness": r_squared([s], gap),
                "r2_complexity": r_squared([c], gap),
                "n": len(gap),
                "pareto_pairs": pairs,
                "pareto_agreement": share,
            }
        )
    rows.sort(key=lambda r: -r["r2"] if finite(r["r2"]) else 1.0)
    return rows, most


def _joint(report):
    """(rows, most), once per report: the section and the files share them."""
    return report.once("joint", lambda: joint_rows(points_of(report)))


def _has_both_sides(report) -> bool:
    keys = {k for p in points_of(report) for k in p.values}
    return bool(keys & set(SHARPNESS)) and bool(keys & set(COMPLEXITY))


def render_joint_csv(rows: list[dict]) -> str:
    """joint.csv: one row per (sharpness, complexity) pair."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(
            [
                "" if r[k] is None else (repr(r[k]) if isinstance(r[k], float) else r[k])
                for k in COLUMNS
            ]
        )
    return buf.getvalue()


def write_joint(report: Report, out_dir: Path) -> list[Path]:
    """joint.csv and its figure, when jobs carry both sharpness and complexity measures."""
    rows, _ = _joint(report)
    if not rows:
        return []
    from ..plots.cache import save_plot
    from ..plots.joint import plot_joint
    from ..runfiles import atomic_write_bytes

    path = Path(out_dir) / "joint.csv"
    atomic_write_bytes(path, render_joint_csv(rows).encode())
    drawn = (plot_joint, rows, label, SHARPNESS, COMPLEXITY)
    return [path, save_plot(out_dir, "joint", report.plot_format, *drawn)]


def _f(v, spec=".3f") -> str:
    return format(v, spec) if finite(v) else "—"


@SECTIONS.register(
    "joint", "sharpness and complexity together (R², Pareto agreement)", order=12, files=write_joint
)
def joint_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's joint section: sharpness and complexity together (R², Pareto agreement)."""
    if not _has_both_sides(report):
        return []
    rows, most = _joint(report)
    out = ["## Sharpness and complexity together", ""]
    if not rows:
        return out + [
            f"Too few jobs for the joint analysis: {most} completed job(s) carry gen_gap and a "
            f"sharpness and a complexity measure; it needs {MIN_JOBS}.",
            "",
        ]
    out += [
        "For each pair of a sharpness and a complexity measure: R² of the least-squares fit of "
        "gen_gap on both (with an intercept) and on each alone, and the Pareto agreement: among "
        "the job pairs in which one job is lower in both measures, the share in which it also "
        "has the lower gen_gap. Ranked by R².",
        "",
    ]
    if min(r["n"] for r in rows) < TRUST_JOBS:
        out += [
            f"**Caution:** fewer than {TRUST_JOBS} jobs in some pairs: a fit of three numbers on "
            "so few jobs is not to be trusted.",
            "",
        ]
    head = [
        "rank",
        "sharpness",
        "complexity",
        "R²",
        "R² sharpness",
        "R² complexity",
        "n",
        "Pareto pairs",
        "agreement",
    ]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows, 1):
        cells = [
            str(i),
            label(r["sharpness"]),
            label(r["complexity"]),
            _f(r["r2"]),
            _f(r["r2_sharpness"]),
            _f(r["r2_complexity"]),
            str(r["n"]),
            str(r["pareto_pairs"]),
            _f(r["pareto_agreement"], ".2f"),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", f"![joint](joint.{report.plot_format})", ""]
