"""The federated part of ``sam-report`` (the ``federated_sam`` presets): the global model's test
accuracy by round per method, one panel per client split (``federated.png``), and a table of the
final figures and the federated measures per (split, method), mean ± std over seeds.

A method is the algorithm with its clients' optimizer (``fedavg+base``, ``fedsam`` = fedavg with
a SAM variant, named after it when it is not sam: ``fedavg+asam``; ``fedfft``, ``fedvssam``), a
split IID or Dirichlet α. Present when the jobs hold a federated run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..runfiles import finite
from .sections import SECTIONS, figure
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from .sweep import Job, Report

STEM = "federated"
# the table's columns: summary.json's key → header
KEYS = {
    "test_acc": "test acc",
    "test_ece": "ECE",
    "lambda_max": "λ_max",
    "eps_pairwise_cos": "ε pairwise cos",
    "eps_low_freq_share": "ε low-freq share",
    "eps_global_cos": "cos(ε, global)",
}


def method_of(job: Job) -> str:
    """A federated job's method as the report names it (``fedsam`` for FedAvg with SAM, else
    ``<name>+<variant>``)."""
    name = str(job.run.get("federated.name"))
    if name == "fedavg":
        return {"base": "fedavg+base", "sam": "fedsam"}.get(job.variant, f"fedavg+{job.variant}")
    return name if job.variant == "sam" else f"{name}+{job.variant}"


def split_of(job: Job) -> str:
    """``IID``, or the Dirichlet split's α."""
    alpha = job.run.get("federated.dirichlet_alpha")
    return "IID" if alpha is None else f"Dirichlet α={float(alpha):g}"


def federated_jobs(report: Report) -> dict:
    """{(split, method): [job, ...]} of the completed federated jobs."""
    out: dict = {}
    for job in report.completed():
        if str(job.run.get("federated.name") or "none") == "none":
            continue
        out.setdefault((split_of(job), method_of(job)), []).append(job)
    return out


def write_federated(report: Report, out_dir: Path) -> list[Path]:
    """The figure of the test accuracy by round, per split and method (nothing without federated
    jobs)."""
    groups = federated_jobs(report)
    if not groups:
        return []
    from ..plots.cache import save_plot
    from ..plots.federated import plot_rounds

    series: dict = {}
    for (split, method), jobs in groups.items():
        by_round = series.setdefault(split, {}).setdefault(method, {})
        for job in jobs:
            for row in job.run.rows():
                if "round" in row and finite(row.get("test_acc")):
                    by_round.setdefault(row["round"], []).append(row["test_acc"])
    return [save_plot(out_dir, STEM, report.plot_format, plot_rounds, series)]


@SECTIONS.register(
    "federated", "the global model by round and method, and the federated measures", order=46,
    files=write_federated,
)  # fmt: skip
def federated_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's federated table: per split and method, the last round's measures over seeds,
    and its figure."""
    groups = federated_jobs(report)
    if not groups:
        return []
    head = ["split", "method", *KEYS.values(), "n"]
    out = ["## Federated", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (split, method), jobs in sorted(groups.items()):
        cells = [stats_cell(stats([(j.run.summary or {}).get(k) for j in jobs])) for k in KEYS]
        out.append("| " + " | ".join([split, method, *cells, str(len(jobs))]) + " |")
    return out + [
        "",
        figure(f"{STEM}.{report.plot_format}"),
        "",
        "Mean ± std over seeds of the global model at the last round: test accuracy, ECE, λ_max "
        "on the clients' union; the inconsistency of the clients' perturbations (ε pairwise "
        "cos: their mean pairwise cosine in the last round; ε low-freq share: the share of ε's "
        "energy in the lowest federated.measure_cutoff of each tensor's frequencies) and their "
        "incompatibility with the global model's SAM direction (cos(ε, global)). Base-optimizer "
        "clients have no ε. docs/federated.md defines each.",
        "",
    ]
