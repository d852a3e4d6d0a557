"""The probabilistic-circuit part of ``sam-report`` (the ``pc_sharpness`` presets): per training
setting (base optimizer, regularizer, weight; over seeds) the test bits per dimension, the
train–test gap in log-likelihood, the exact Hessian trace in the sum weights, its share at each
depth, and λ_max in the same weights (docs/circuits.md). A regularizer of weight 0 is the plain
run: those jobs are one row, ``none``. Present when a job holds ``hessian_trace_exact``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .sections import SECTIONS, figure
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from .sweep import Report

KEYS = ("test_bpd", "gap", "hessian_trace_exact", "lambda_max")
HEAD = ("test bpd", "train − test ll", "tr H (exact)", "λ_max")


def _setting(run) -> tuple:
    weight = run.get("regularizer.weight") or 0
    name = run.get("regularizer.name") or "none"
    return (str(run.get("base_optimizer.name")), "none" if not weight else name, float(weight))


def circuit_rows(report: Report) -> tuple[dict, int]:
    """({setting: {key: stats}}, the deepest depth logged + 1)."""
    values: dict = {}
    depth, seen = 0, set()
    for job in report.completed():
        s = job.run.summary or {}
        setting = _setting(job.run)
        # weight 0 under two regularizer names: the same plain run, counted once per seed
        if "hessian_trace_exact" not in s or (setting, job.run.get("seed")) in seen:
            continue
        seen.add((setting, job.run.get("seed")))
        row = {k: s.get(k) for k in ("test_bpd", "hessian_trace_exact", "lambda_max")}
        if s.get("train_ll") is not None and s.get("test_ll") is not None:
            row["gap"] = s["train_ll"] - s["test_ll"]
        for key, v in s.items():
            if key.startswith("hessian_trace_depth_"):
                row[key] = v
                depth = max(depth, int(key.rsplit("_", 1)[1]) + 1)
        values.setdefault(setting, []).append(row)
    keys = [*KEYS, *(f"hessian_trace_depth_{t}" for t in range(depth))]
    out = {k: {key: stats([r.get(key) for r in rs]) for key in keys} for k, rs in values.items()}
    return dict(sorted(out.items())), depth


STEM = "circuits"


def write_circuits(report: Report, out_dir: Path) -> list[Path]:
    """The circuits figure: per setting, density, gap and curvature by depth (nothing without
    circuit jobs)."""
    rows, depth = circuit_rows(report)
    if not rows:
        return []
    from ..plots.cache import save_plot
    from ..plots.circuits import plot_circuits

    return [save_plot(out_dir, STEM, report.plot_format, plot_circuits, rows, depth)]


@SECTIONS.register(
    "circuits",
    "density, train–test gap and exact curvature by depth",
    order=46,
    files=write_circuits,
)
def circuits_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's circuits section: density, train–test gap and exact curvature by depth, per
    setting."""
    rows, depth = circuit_rows(report)
    if not rows:
        return []
    head = ["base", "regularizer", "weight", "n", *HEAD, *(f"depth {t}" for t in range(depth))]
    out = [
        "## Probabilistic circuits",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for (base, reg, weight), r in rows.items():
        n = max(s["n"] for s in r.values())
        cells = [base, reg, f"{weight:g}", str(n), *(stats_cell(r[k]) for k in KEYS)]
        cells += [stats_cell(r[f"hessian_trace_depth_{t}"]) for t in range(depth)]
        out.append("| " + " | ".join(cells) + " |")
    return out + [
        "",
        figure(f"{STEM}.{report.plot_format}"),
        "",
        "Mean ± std over seeds. test bpd: bits per dimension on the test set; train − test ll: "
        "the gap in mean log-likelihood per example (nats); tr H: the exact trace of the Hessian "
        "of the mean training log-likelihood in the sum weights (≤ 0; its magnitude is the "
        "sharpness), split by the depth of the sum nodes (depth 0: the root); λ_max: the top "
        "eigenvalue of the NLL's Hessian in the same weights.",
        "",
    ]
