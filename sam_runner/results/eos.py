"""The edge-of-stability part of ``sam-report``: for a sweep whose jobs measured λ_max within
epochs (``metrics.hessian.every_n_steps``), one λ_max trace per job against the step with its
stability threshold (eos.png), and a table of the plateau: the mean of λ_max / threshold over
the last third of the measured steps (λ_max·η/2 for gradient descent: 1 at the edge of
stability), and for SAM the same against the SAM edge of Long & Bartlett (2023)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ..runfiles import finite
from .sections import SECTIONS
from .sweep import group_overrides, stats

if TYPE_CHECKING:
    from pathlib import Path

    from .sweep import Report

LAST = 1 / 3  # the plateau: the last third of the measured steps


def traces(report: Report) -> list[dict]:
    """One trace per completed job that measured λ_max at three or more steps within epochs
    (read once per report: the figure and the section share them)."""
    return report.once("eos_traces", lambda: _read_traces(report))


def _read_traces(report: Report) -> list[dict]:
    out = []
    for job in report.completed():
        rows = [
            r
            for r in job.run.rows()
            if finite(r.get("lambda_max")) and finite(r.get("step")) and "train_loss" not in r
        ]
        if len(rows) >= 3:
            out.append(
                {
                    "job": job,
                    "steps": [r["step"] for r in rows],
                    "lambda_max": [r["lambda_max"] for r in rows],
                    "threshold": [r.get("eos_threshold") for r in rows],
                    "sam_edge": [r.get("sam_edge") for r in rows],
                }
            )
    return out


def plateau(trace: dict, key: str) -> float | None:
    """Mean of λ_max / ``key`` (``threshold`` or ``sam_edge``) over the last third of the steps."""
    start = trace["steps"][0] + (1 - LAST) * (trace["steps"][-1] - trace["steps"][0])
    ratios = [
        lam / ref
        for s, lam, ref in zip(trace["steps"], trace["lambda_max"], trace[key])
        if s >= start and finite(ref) and ref > 0
    ]
    return statistics.fmean(ratios) if ratios else None


@SECTIONS.register("edge_of_stability", "λ_max against its stability threshold", order=40)
def eos_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's edge-of-stability section: λ_max against its stability threshold."""
    return section(report, traces(report))


def section(report: Report, traces_: list[dict]) -> list[str]:
    """report.md's edge-of-stability table: one row per group (the jobs differing in seed)."""
    if not traces_:
        return []

    groups: dict = {}
    for t in traces_:
        groups.setdefault(group_overrides(t["job"].overrides), []).append(t)
    labels = {g["group"]: g["label"] for g in report.groups}  # the overrides that vary
    out = [
        "## Edge of stability",
        "",
        "| group | η | threshold | λ_max/threshold, last third | λ_max/SAM edge, last third | n |",
        "|---|---|---|---|---|---|",
    ]
    for key, members in groups.items():
        name = labels.get(" ".join(key) or "(defaults)", " ".join(key))
        gd, sam = (stats([plateau(t, k) for t in members]) for k in ("threshold", "sam_edge"))
        ref = next((v for v in members[0]["threshold"] if finite(v)), None)
        out.append(
            f"| {name} | {_g(members[0]['job'].lr)} | {_g(ref)} | {_ms(gd)} | {_ms(sam)} | "
            f"{len(members)} |"
        )
    return out + [
        "",
        "The threshold is the step's stability limit on a quadratic (2/η for plain "
        "gradient descent): a ratio near 1 over the last third of the steps is the edge "
        "of stability (Cohen et al. 2021). SAM's own edge depends on the gradient norm "
        "(Long & Bartlett 2023). Traces: eos.png.",
        "",
    ]


def _g(v) -> str:
    return "—" if v is None else f"{v:.4g}"


def _ms(s: dict) -> str:
    if not s["n"]:
        return "—"
    return f"{s['mean']:.3f}" + (f" ± {s['std']:.2g}" if s["std"] is not None else "")
