"""Accuracy per compute in ``sam-report``: what each group's accuracy and sharpness cost.

One point per group whose completed jobs counted their passes (``summary.json``'s
``grad_evals_per_step`` and ``step``): its mean total gradient evaluations (passes per step ×
steps, forwards without gradients at ⅓), its mean test accuracy and λ_max. A point is on the
Pareto front of a panel when no other point costs no more and is no worse (higher accuracy;
lower λ_max), one of the two strictly. The section names the cheapest group that matches SAM
(the ``sam`` group with the most passes per step: SAM on every step) within ``ACC_POINTS``
points of test accuracy and ``LAMBDA_SHARE`` of its λ_max; ``compute.<format>`` is the figure
(report.py draws it). In a preset in stages a point competes only with its own stage's (a
pretraining run and a post-training run are not alternatives to each other).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ..rundir import RunDir
from ..runfiles import finite
from .sections import SECTIONS

if TYPE_CHECKING:
    from pathlib import Path

    from .sweep import Report

ACC_POINTS = 0.3  # "reaches SAM's accuracy": within 0.3 percentage points
LAMBDA_SHARE = 0.10  # ... and its λ_max within 10%


def compute_points(report: Report) -> list[dict]:
    """One dict per group with counted passes: label, variant, passes (per step), evals
    (total), test_acc, lambda_max (group means; None where not logged)."""
    out = []
    runs = {j.path: j.run for j in report.completed()}  # the readers load_job made: read once
    for g in report.groups:
        summaries = [(runs.get(d) or RunDir(d)).summary or {} for d in g["dirs"]]
        evals = [
            s["grad_evals_per_step"] * s["step"]
            for s in summaries
            if finite(s.get("grad_evals_per_step")) and finite(s.get("step"))
        ]
        if not evals:
            continue
        per_step = [
            s["grad_evals_per_step"] for s in summaries if finite(s.get("grad_evals_per_step"))
        ]
        out.append(
            dict(
                label=g["label"],
                variant=g["variant"],
                stage=g.get("stage", ""),
                passes=statistics.fmean(per_step),
                evals=statistics.fmean(evals),
                test_acc=g["stats"]["test_acc"]["mean"],
                lambda_max=g["stats"]["lambda_max"]["mean"],
            )
        )
    return out


def costs_differ(points: list[dict]) -> bool:
    """Whether the groups' costs differ (by more than a thousandth): with one cost for all (a ρ
    sweep of one variant, seeds) accuracy per compute says nothing, and its figure spans one
    value."""
    evals = [p["evals"] for p in points if finite(p["evals"])]
    return len(evals) > 1 and max(evals) > min(evals) * 1.001


def pareto_front(points: list[dict], key: str, maximize: bool) -> list[bool]:
    """Whether each point is on the front of (``evals`` down, ``key`` up or down); points without
    the value are off it."""

    def better_or_equal(a, b):  # a's value at least as good as b's
        return a >= b if maximize else a <= b

    front = []
    for p in points:
        v = p[key]
        if not finite(v):
            front.append(False)
            continue
        dominated = any(
            q is not p
            and q.get("stage") == p.get("stage")
            and finite(q[key])
            and q["evals"] <= p["evals"]
            and better_or_equal(q[key], v)
            and (q["evals"] < p["evals"] or q[key] != v)
            for q in points
        )
        front.append(not dominated)
    return front


def cheapest_match(points: list[dict]) -> tuple[dict | None, dict | None]:
    """(SAM's point, the cheapest point within ACC_POINTS of its accuracy and LAMBDA_SHARE of its
    λ_max), either None when there is none."""
    sams = [p for p in points if p["variant"] == "sam"]
    if not sams:
        return None, None
    sam = max(sams, key=lambda p: p["passes"])
    if not (finite(sam["test_acc"]) and finite(sam["lambda_max"])):
        return sam, None
    close = [
        p
        for p in points
        if p.get("stage") == sam.get("stage")
        and finite(p["test_acc"])
        and finite(p["lambda_max"])
        and p["test_acc"] >= sam["test_acc"] - ACC_POINTS / 100
        and p["lambda_max"] <= sam["lambda_max"] * (1 + LAMBDA_SHARE)
    ]
    return sam, min(close, key=lambda p: (p["evals"], -p["test_acc"]), default=None)


def _fmt(v, spec=".4g"):
    return "—" if v is None else format(v, spec)


@SECTIONS.register("compute", "accuracy and λ_max against the gradient evaluations", order=33)
def section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's compute section: accuracy and λ_max against the gradient evaluations (nothing
    when every group costs the same)."""
    points = compute_points(report)
    if not costs_differ(points):
        return []
    acc_front = pareto_front(points, "test_acc", maximize=True)
    lam_front = pareto_front(points, "lambda_max", maximize=False)
    head = ["group", "passes/step", "gradient evaluations", "test accuracy", "λ_max", "front"]
    out = ["## Accuracy per compute", "", "| " + " | ".join(head) + " |", "|" + "---|" * 6]
    for p, a, lam in sorted(zip(points, acc_front, lam_front), key=lambda t: t[0]["evals"]):
        front = ", ".join(w for w, on in (("accuracy", a), ("λ_max", lam)) if on) or "—"
        cells = [p["label"], f"{p['passes']:.3g}", f"{p['evals']:.4g}"]
        cells += [_fmt(p["test_acc"]), _fmt(p["lambda_max"]), front]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    sam, best = cheapest_match(points)
    out += [""]
    if best is not None:
        out.append(
            f"Cheapest within {ACC_POINTS} points of SAM's test accuracy and {LAMBDA_SHARE:.0%} "
            f"of its λ_max (SAM: `{sam['label']}`, {sam['passes']:.3g} passes/step): "
            f"`{best['label']}`, {best['passes']:.3g} passes/step ({best['evals']:.4g} gradient "
            "evaluations)."
        )
    elif sam is not None:
        out.append(
            "No group is within reach of SAM's test accuracy and λ_max (or they are not logged)."
        )
    return out + [
        "",
        "Gradient evaluations: forward-backward passes over the run (`grad_evals_per_step` × "
        "steps; a pass over part of the batch counts as that part, a forward without gradients "
        "as ⅓), the group's mean; on the front: no other group costs no more and does no worse.",
        "",
    ]
