"""Weight averaging in ``sam-report``: for the groups whose jobs averaged their weights
(``trainer.weight_averaging=swa|ema``), the last weights beside the averaged ones in test
accuracy, ECE and λ_max (each job's ``summary.json``: ``test_acc`` against ``avg_test_acc``,
and so on), so that SWA reads against SAM in one table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..rundir import RunDir
from .sections import SECTIONS
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from pathlib import Path

    from .sweep import Report

# (the last weights' key, the averaged weights' key, the column's label)
PAIRS = (
    ("test_acc", "avg_test_acc", "test accuracy"),
    ("test_ece", "avg_test_ece", "test ECE"),
    ("lambda_max", "avg_lambda_max", "λ_max"),
)


def _summaries(group: dict, runs: dict) -> list[dict]:
    return [(runs.get(d) or RunDir(d)).summary or {} for d in group["dirs"]]


def _kind(summary: dict) -> str | None:
    """The averaging a job's summary records (``weight_averaging``: {"kind", "n_averaged"})."""
    kind = (summary.get("weight_averaging") or {}).get("kind")
    return None if kind in (None, "none") else str(kind)


def averaged_groups(report: Report) -> list[tuple[dict, str, dict]]:
    """(group, averaging kind, statistics per key) for each group with averaged weights."""
    out = []
    runs = {j.path: j.run for j in report.completed()}  # the readers load_job made: read once
    for g in report.groups:
        summaries = [s for s in _summaries(g, runs) if _kind(s)]
        if summaries:
            kinds = sorted({_kind(s) for s in summaries})
            keys = [k for pair in PAIRS for k in pair[:2]]
            values = {k: stats([s.get(k) for s in summaries]) for k in keys}
            out.append((g, "/".join(kinds), values))
    return out


@SECTIONS.register("averaging", "last against averaged weights (SWA, EMA)", order=35)
def section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's averaging section: last against averaged weights (SWA, EMA), per group."""
    rows = averaged_groups(report)
    if not rows:
        return []
    head = ["group", "averaging"]
    head += [f"{label}: {w}" for _, _, label in PAIRS for w in ("last", "averaged")]
    out = ["## Averaged weights", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g, kind, s in rows:
        cells = [
            g["label"],
            kind,
            *(stats_cell(s[k]) for last, avg, _ in PAIRS for k in (last, avg)),
        ]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out + [
        "",
        "Mean ± sample std over the group's completed jobs that averaged their weights; the "
        "averaged weights are measured after their BatchNorm statistics are recomputed on the "
        "un-augmented training set, with the run's own curvature settings (avg_lambda_max).",
        "",
    ]
