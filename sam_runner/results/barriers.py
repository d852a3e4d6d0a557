"""The barrier matrix of ``sam-report``: for a sweep connected by ``sam-landscape SWEEP_DIR
landscape.pairs=optimizers``, the mean barrier of the pairs of each pair of base optimizers
(within one optimizer on the diagonal: its seeds; across two off it), as ``barriers.csv``, a
heat map (``barriers.png``) and a section of report.md.

A pair counts when both of its jobs are completed jobs of the report and their overrides agree
once ``seed`` and ``base_optimizer`` are left out (the pairs ``landscape.pairs=optimizers``
makes; a ``landscape.to`` result between two such jobs counts too). Its barriers are read from
the first job's ``landscape/<job>/landscape.json`` through ``rundir.RunDir.pair_summaries``.
The section is present when some pair joins two different optimizers (a sweep of one optimizer
has its barriers in the landscape section's table already).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from .landscape import PAIR_KEYS
from .sections import SECTIONS, figure
from .sweep import group_overrides, stats

if TYPE_CHECKING:
    from .sweep import Job, Report

IGNORE = ("base_optimizer",)  # with seed: what a pair's two jobs may differ in
SHOWN = {"barrier_train_loss": "train loss", "barrier_test_error": "test error"}
STEM = "barriers"
STATS = ("mean", "std", "n")


def optimizer_of(job: Job) -> str:
    """A job's base optimizer's name (from its config, else its overrides), or ``unknown``."""
    name = job.run.get("base_optimizer.name")
    if name is None:
        name = next(
            (o.split("=", 1)[1] for o in job.overrides if o.startswith("base_optimizer=")), None
        )
    return str(name or "unknown")


def _order(report) -> dict:
    """{optimizer: its place}: the order of the optimizers' first jobs in the report."""
    order: dict = {}
    for j in report.completed():
        order.setdefault(optimizer_of(j), len(order))
    return order


def pair_barriers(report: Report) -> list[dict]:
    """One entry per connected pair: ``optimizers`` (the two names, the sweep's order),
    ``seeds`` (``same``: two optimizers from one initialization; ``different``) and the pair's
    barriers (PAIR_KEYS; None where not computed). Read once per report: the files and the
    section share them."""
    return report.once("pair_barriers", lambda: _read_pair_barriers(report))


def _read_pair_barriers(report: Report) -> list[dict]:
    found = [(j, s) for j in report.completed() if (s := j.run.pair_summaries())]
    if not found:  # no pair measured: no folder resolved (a study of 1,000s has none)
        return []
    jobs = {str(Path(j.path).resolve()): j for j in report.completed()}
    order = _order(report)
    out = []
    for job, summaries in found:
        for s in summaries:
            other = jobs.get(s["run_b"].get("run"))
            if other is None or other is job:
                continue
            if group_overrides(job.overrides, IGNORE) != group_overrides(other.overrides, IGNORE):
                continue
            names = sorted((optimizer_of(job), optimizer_of(other)), key=order.get)
            same = job.run.get("seed") == other.run.get("seed")
            out.append(
                {
                    "optimizers": tuple(names),
                    "seeds": "same" if same else "different",
                    **{k: s.get(k) for k in PAIR_KEYS},
                }
            )
    return out


def barrier_matrix(report: Report) -> dict | None:
    """{"optimizers": names in the sweep's order, "cells": {(a, b, seeds): {key: stats}}} over
    the pairs of each optimizer pair (a before b or a = b) of different or the same seeds (the
    matrix: ``different``, as every pair within one optimizer is); None without a pair across
    two optimizers."""
    pairs = pair_barriers(report)
    if not any(a != b for a, b in (p["optimizers"] for p in pairs)):
        return None
    names = sorted({n for p in pairs for n in p["optimizers"]}, key=_order(report).get)
    cells = {}
    for p in pairs:
        cells.setdefault((*p["optimizers"], p["seeds"]), []).append(p)
    return {
        "optimizers": names,
        "cells": {
            k: {key: stats([p[key] for p in members]) for key in PAIR_KEYS}
            for k, members in cells.items()
        },
    }


def render_csv(matrix: dict) -> str:
    """barriers.csv: one row per optimizer pair, seeds and barrier key (its statistics)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["optimizer_a", "optimizer_b", "seeds", *(f"{k}_{s}" for k in PAIR_KEYS for s in STATS)]
    )
    for (a, b, seeds), cell in matrix["cells"].items():
        row = [a, b, seeds]
        for k in PAIR_KEYS:
            row += ["" if cell[k][s] is None else repr(cell[k][s]) for s in ("mean", "std")]
            row.append(cell[k]["n"])
        w.writerow(row)
    return buf.getvalue()


def write_barriers(report: Report, out_dir: Path) -> list[Path]:
    """barriers.csv and the heat map, when some pair joins two optimizers (else nothing)."""
    matrix = barrier_matrix(report)
    if matrix is None:
        return []
    from ..plots.barriers import plot_barriers
    from ..plots.cache import save_plot
    from ..runfiles import atomic_write_bytes

    path = Path(out_dir) / f"{STEM}.csv"
    atomic_write_bytes(path, render_csv(matrix).encode())
    return [path, save_plot(out_dir, STEM, report.plot_format, plot_barriers, matrix, SHOWN)]


def _cell(s: dict | None) -> str:
    if s is None or not s["n"]:
        return "—"
    text = f"{s['mean']:.3g}" + (f" ± {s['std']:.2g}" if s["std"] is not None else "")
    return text + f" (n={s['n']})"


def cell(cells: dict, a: str, b: str, key: str, seeds: str = "different") -> dict | None:
    """The stats of ``key`` over the pairs of optimizers a and b (either order)."""
    return (cells.get((a, b, seeds)) or cells.get((b, a, seeds)) or {}).get(key)


def _table(matrix: dict, key: str, seeds: str = "different") -> list[str]:
    names, cells = matrix["optimizers"], matrix["cells"]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for a in names:
        row = [cell(cells, a, b, key, seeds) for b in names]
        lines.append(f"| **{a}** | " + " | ".join(_cell(s) for s in row) + " |")
    return lines


@SECTIONS.register(
    "barriers", "the mean barrier by base-optimizer pair", order=55, files=write_barriers
)
def barriers_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's barriers by optimizer pair: mean barrier tables (different seeds, then one
    seed) and the heat map."""
    matrix = barrier_matrix(report)
    if matrix is None:
        return []
    out = ["## Barriers by optimizer pair", ""]
    for key, what in SHOWN.items():
        out += [f"Mean barrier, {what}, jobs of different seeds:", "", *_table(matrix, key), ""]
    if any(k[2] == "same" for k in matrix["cells"]):
        key = "barrier_train_loss"
        out += ["Mean barrier, train loss, two optimizers from one seed:", ""]
        out += [*_table(matrix, key, "same"), ""]
    return out + [
        figure(f"{STEM}.{report.plot_format}"),
        "",
        "Each cell: the mean ± std over the connected pairs of jobs trained by the row's and "
        "the column's base optimizer (the diagonal: two seeds of one optimizer), n = pairs. "
        "Two jobs of one seed start from the same weights, so the pairs across optimizers of "
        "one seed are shown apart (the last table); the matrices and barriers.png hold the "
        "pairs of different seeds, comparable with the diagonal. A "
        "barrier is the highest rise of the loss (error) along the straight line between the "
        "two jobs above the straight line between its end values (sam-landscape "
        "landscape.pairs=optimizers). All columns: barriers.csv.",
        "",
    ]
