"""A sweep folder: the connectivity of every pair of jobs that differ only in seed
(``--pairs seeds``), or every job's slices; resumable, both.

The jobs are the sweep's completed job folders (``sweep.plan.job_dirs``, summary status
``completed``, a checkpoint); two jobs are of one group when their overrides agree once
``seed`` and the how-it-runs keys are left out (``report.group_overrides``: the groups of
sam-report). In each group every pair (A, B) with A before B in the sweep's order is connected
once, into A's landscape/ folder. A pair (or a job's slices) whose landscape.json was written
with the same options is skipped: a stopped call, run again, does only what is left.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from ..errors import require
from ..report import group_overrides
from ..runfiles import CHECKPOINT, read_json
from ..sweep.plan import job_dirs, saved_overrides
from .connectivity import connect, connectivity_done
from .files import FOLDER, SUMMARY, clean
from .runs import load_run
from .slices import run_slices


def completed_jobs(sweep_dir: Path) -> list[Path]:
    dirs = job_dirs(sweep_dir)
    require(
        bool(dirs),
        f"{sweep_dir} holds no run: no checkpoint, and no job folders (folders with .hydra/ "
        "or summary.json) below it; pass a run folder or a sweep folder sam-run wrote",
    )
    return [
        d
        for d in dirs
        if (read_json(d / "summary.json") or {}).get("status") == "completed"
        and (d / CHECKPOINT).is_file()
    ]


def seed_pairs(jobs: list[Path]) -> list[tuple[Path, Path]]:
    """Every pair of jobs of one group (jobs that differ only in seed), in the sweep's order."""
    groups: dict = {}
    for d in jobs:
        groups.setdefault(group_overrides(saved_overrides(d) or []), []).append(d)
    return [pair for members in groups.values() for pair in itertools.combinations(members, 2)]


def connect_pairs(sweep_dir: Path, opt, device, say=print) -> dict:
    """Connect every seed pair not done yet; counts of pairs, skipped and computed."""
    jobs = completed_jobs(sweep_dir)
    pairs = seed_pairs(jobs)
    todo = [(a, b) for a, b in pairs if not connectivity_done(a, b, opt)]
    say(
        f"{len(pairs)} seed pair(s) among {len(jobs)} completed job(s): "
        f"{len(pairs) - len(todo)} already done, {len(todo)} to compute"
    )
    for i, (a, b) in enumerate(todo, 1):
        summary = connect(load_run(a, device), load_run(b, device), opt)
        say(
            f"  [{i}/{len(todo)}] {_rel(a, sweep_dir)} → {_rel(b, sweep_dir)}: {_barriers(summary)}"
        )
    return {"pairs": len(pairs), "skipped": len(pairs) - len(todo), "computed": len(todo)}


def slices_done(job: Path, opt) -> bool:
    held = read_json(job / FOLDER / SUMMARY) or {}
    return held.get("options") == clean(opt.slice_options())


def slice_jobs(sweep_dir: Path, opt, device, say=print) -> dict:
    """Every completed job's slices, skipping jobs whose slices have these options already."""
    jobs = completed_jobs(sweep_dir)
    todo = [j for j in jobs if not slices_done(j, opt)]
    say(
        f"{len(jobs)} completed job(s): {len(jobs) - len(todo)} already done, "
        f"{len(todo)} to compute"
    )
    for i, job in enumerate(todo, 1):
        summary = run_slices(load_run(job, device), opt)
        width = summary.get("basin_width_1d")
        say(f"  [{i}/{len(todo)}] {_rel(job, sweep_dir)}: basin width {_fmt(width)}")
    return {"jobs": len(jobs), "skipped": len(jobs) - len(todo), "computed": len(todo)}


def _rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _barriers(s: dict) -> str:
    return (
        f"barrier train loss {_fmt(s.get('barrier_train_loss'))}, "
        f"test error {_fmt(s.get('barrier_test_error'))}"
    )
