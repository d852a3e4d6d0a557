"""What sam-report reads of the landscape files (torch-free, like the report).

Per group of the report (its completed jobs): the mean ± std over the jobs that have one of
the 1-D slice's basin width and curvature (``landscape/landscape.json``), and over the pairs
of the group's jobs connected by ``sam-landscape SWEEP_DIR --pairs seeds`` (or by ``--to``
between two of them; a group's jobs differ only in seed) of the barriers
(``landscape/<job>/landscape.json``). report.py calls ``landscape_section`` (a section of
report.md, present when some job has landscape files) and ``csv_columns``/``csv_cells``
(columns of report.csv, always present, blank where nothing was computed), registered as the
report's ``landscape`` section.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..rundir import RunDir
from .sections import SECTIONS
from .sweep import stats

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .sweep import Report

JOB_KEYS = {"basin_width": "basin_width_1d", "curvature": "curvature_1d"}
PAIR_KEYS = ("barrier_train_loss", "barrier_test_loss", "barrier_train_error", "barrier_test_error")
LANDSCAPE = "_landscape"  # a group's statistics, kept in its row for the second reader
HEAD = {
    "basin_width": "basin width",
    "curvature": "curvature",
    "barrier_train_loss": "barrier, train loss",
    "barrier_test_error": "barrier, test error",
}


def _resolved(path) -> str:
    return str(Path(path).resolve())


def pair_summaries(job: Path) -> list[dict]:
    """The connectivity results stored under a job's landscape/ folder."""
    return RunDir(job).pair_summaries()


def group_landscape(dirs: Iterable[Path | str | None]) -> dict:
    """{key: stats} over a group's job folders (``dirs``): slice numbers per job, barriers per
    pair of them."""
    dirs = [d for d in dirs if d is not None]
    jobs = [RunDir(d).landscape() or {} for d in dirs]
    out = {k: stats([j.get(key) for j in jobs]) for k, key in JOB_KEYS.items()}
    found = [(d, s) for d in dirs if (s := pair_summaries(d))]
    # the folders resolved only where some pair was measured: a study of 1,000s has none
    members = {_resolved(d) for d in dirs} if found else set()
    pairs = [
        s
        for d, summaries in found
        for s in summaries
        if s["run_b"].get("run") in members and s["run_b"]["run"] != _resolved(d)
    ]
    out.update({k: stats([p.get(k) for p in pairs]) for k in PAIR_KEYS})
    return out


def _group_landscape(group: dict) -> dict:
    """``group_landscape`` of a report's group, computed once (report.csv and report.md)."""
    if LANDSCAPE not in group:
        group[LANDSCAPE] = group_landscape(group.get("dirs", []))
    return group[LANDSCAPE]


def _cell(s: dict) -> str:
    if not s["n"]:
        return "—"
    text = f"{s['mean']:.4g}" + (f" ± {s['std']:.2g}" if s["std"] is not None else "")
    return text + f" (n={s['n']})"


def csv_columns() -> list[str]:
    """report.csv's landscape columns: mean, std and n of each landscape key."""
    keys = [f"landscape_{k}" for k in JOB_KEYS] + list(PAIR_KEYS)
    return [f"{k}_{s}" for k in keys for s in ("mean", "std", "n")]


def csv_cells(group: dict) -> list:
    """One group's landscape cells for report.csv."""
    s = _group_landscape(group)
    cells = []
    for k in (*JOB_KEYS, *PAIR_KEYS):
        v = s[k]
        cells += ["" if v["mean"] is None else repr(v["mean"])]
        cells += ["" if v["std"] is None else repr(v["std"]), v["n"]]
    return cells


@SECTIONS.register(
    "landscape",
    "basin width, curvature and barriers of sam-landscape",
    order=50,
    csv_columns=csv_columns,
    csv_cells=csv_cells,
)
def landscape_section(report: Report, _plots: list[Path]) -> list[str]:
    """report.md's landscape section: one row per group with landscape files."""
    rows = []
    for g in report.groups:
        s = _group_landscape(g)
        if any(v["n"] for v in s.values()):
            cells = [g["label"], *(_cell(s[k]) for k in HEAD)]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if not rows:
        return []
    head = ["group", *HEAD.values()]
    return [
        "## Loss landscape",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *rows,
        "",
        "Basin width: the length of the interval around θ along the 1-D slice's direction where "
        "the training-subset loss stays ≤ L(θ) + 0.1; curvature: the second derivative of that "
        "slice at θ from a quadratic fit; n = jobs. Barriers: the highest rise of the loss "
        "(error) along the straight line between two jobs of the group (they differ only in "
        "seed) above the straight line between the end values; n = pairs. "
        "Written by sam-landscape; see docs/landscape.md of sam-runner.",
        "",
    ]
