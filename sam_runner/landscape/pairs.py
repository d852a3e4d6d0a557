"""A sweep folder: the connectivity of every pair of jobs that differ only in seed
(``landscape.pairs=seeds``), or only in base optimizer and seed (``landscape.pairs=optimizers``:
the seed pairs and the pairs across optimizers), or every job's slices; resumable, all.

The jobs are the sweep's completed job folders (``runfiles.job_dirs``, summary status
``completed``, a checkpoint); two jobs are of one group when their overrides agree once
``seed`` (and, for ``optimizers``, ``base_optimizer``) and the how-it-runs keys are left out
(``results.sweep.group_overrides``: with ``seeds``, the groups of sam-report). In each group
every pair (A, B) with A before B in the sweep's order is connected once, into A's landscape/
folder. A pair (or a job's slices) whose landscape.json was written
with the same options is skipped: a stopped call, run again, does only what is left.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import require
from ..rebuild import load_run
from ..results.sweep import group_overrides
from ..rundir import CHECKPOINT, RunDir, job_dirs, require_sam_run_jobs
from ..sweep.plan import saved_overrides
from .figures import draw_pair, draw_slices, drawn, slice_figures
from .files import connectivity_done, folder, pair_folder, slices_done
from .options import PAIRINGS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import torch

    from .options import Options


def completed_jobs(sweep_dir: Path) -> list[Path]:
    """The sweep's completed job folders (a one-line error when it has none)."""
    dirs = job_dirs(sweep_dir)
    require(
        bool(dirs),
        f"{sweep_dir} holds no run: no checkpoint, and no job folders (folders with .hydra/ "
        "or summary.json) below it; pass a run folder or a sweep folder sam-run wrote",
    )
    require_sam_run_jobs(sweep_dir, dirs, "RUN_DIR")
    return [d for d in dirs if RunDir(d).status == "completed" and (d / CHECKPOINT).is_file()]


def seed_pairs(jobs: list[Path], pairing: str = "seeds") -> list[tuple[Path, Path]]:
    """Every pair of jobs of one group (jobs that differ only in seed, or with ``optimizers``
    only in base optimizer and seed), in the sweep's order."""
    ignore = PAIRINGS[pairing][0]
    groups: dict = {}
    for d in jobs:
        groups.setdefault(group_overrides(saved_overrides(d) or [], ignore), []).append(d)
    return [pair for members in groups.values() for pair in itertools.combinations(members, 2)]


def connect_pairs(
    sweep_dir: Path,
    opt: Options,
    device: Callable[[], torch.device | None],
    say: Callable[[str], None] = print,
    array: tuple | None = None,
    pairing: str = "seeds",
) -> dict:
    """Connect every pair of ``pairing`` (PAIRINGS) not done yet; counts of pairs, skipped and
    computed (and failed, with ``array``: (submitit cluster, launcher parameters), one task a
    pair). ``device()`` gives the device, called only when a pair is computed here (torch loads
    then)."""
    jobs = completed_jobs(sweep_dir)
    pairs = seed_pairs(jobs, pairing)
    todo = [(a, b) for a, b in pairs if not connectivity_done(a, b, opt)]
    folders = [pair_folder(a, b, opt.weights) for a, b in pairs if (a, b) not in todo]
    redrawn = redraw_missing(folders, ["connectivity"], opt, draw_pair)
    say(
        f"{len(pairs)} {PAIRINGS[pairing][1]} among {len(jobs)} completed job(s): "
        f"{len(pairs) - len(todo)} already done, {len(todo)} to compute{redrawn}"
    )
    names = [f"{_rel(a, sweep_dir)} → {_rel(b, sweep_dir)}" for a, b in todo]
    counts = {"pairs": len(pairs), "skipped": len(pairs) - len(todo), "computed": len(todo)}
    if array is not None:
        return {**counts, **_in_array(connect_task, todo, opt, array, names, _barriers, say)}
    for i, (a, b) in enumerate(todo, 1):
        summary = connect_task(a, b, opt, device())
        say(f"  [{i}/{len(todo)}] {names[i - 1]}: {_barriers(summary)}")
    return counts


def slice_jobs(
    sweep_dir: Path,
    opt: Options,
    device: Callable[[], torch.device | None],
    say: Callable[[str], None] = print,
    array: tuple | None = None,
) -> dict:
    """Every completed job's slices, skipping jobs whose slices have these options already (one
    task a job with ``array``)."""
    jobs = completed_jobs(sweep_dir)
    todo = [j for j in jobs if not slices_done(j, opt)]
    folders = [folder(j, opt.weights) for j in jobs if j not in todo]
    draw = lambda out, fmt: draw_slices(out, fmt, opt.slices)  # noqa: E731
    redrawn = redraw_missing(folders, slice_figures(opt.slices), opt, draw)
    say(
        f"{len(jobs)} completed job(s): {len(jobs) - len(todo)} already done, "
        f"{len(todo)} to compute{redrawn}"
    )
    names = [_rel(j, sweep_dir) for j in todo]
    counts = {"jobs": len(jobs), "skipped": len(jobs) - len(todo), "computed": len(todo)}
    if array is not None:
        items = [(j,) for j in todo]
        return {**counts, **_in_array(slice_task, items, opt, array, names, _width, say)}
    for i, job in enumerate(todo, 1):
        summary = slice_task(job, opt, device())
        say(f"  [{i}/{len(todo)}] {names[i - 1]}: {_width(summary)}")
    return counts


def redraw_missing(
    folders: Iterable[Path], stems: Iterable[str], opt: Options, draw: Callable[[Path, str], object]
) -> str:
    """Done folders without their figures in ``opt.plot_format`` drawn from their files (no
    computing); what to add to the first line."""
    missing = [out for out in folders if not drawn(out, stems, opt.plot_format)]
    for out in missing:
        draw(out, opt.plot_format)
    return f" ({len(missing)} drawn as {opt.plot_format} from their files)" if missing else ""


# ------------------------------------------------------------------------- as a job array
def slice_task(job: Path, opt: Options, device: torch.device | str | None = None) -> dict:
    """One job's slices (an array task: on the device its node has, ``trainer.device``)."""
    from ..distributed import resolve_device
    from .slices import run_slices

    return run_slices(load_run(job, device or resolve_device(opt.device), opt.weights), opt)


def connect_task(a: Path, b: Path, opt: Options, device: torch.device | str | None = None) -> dict:
    """One seed pair's connectivity (an array task: on its node's device)."""
    from ..distributed import resolve_device
    from .connectivity import connect

    device = device or resolve_device(opt.device)
    return connect(load_run(a, device, opt.weights), load_run(b, device, opt.weights), opt)


def _in_array(task, items, opt, array, names, describe, say) -> dict:
    """The items as one task each; a failed task is named and the others go on. Raises
    TasksFailed at the end when any failed."""
    from ..errors import one_line
    from ..jobarray import TasksFailed, run_array

    if not items:
        return {}
    cluster, params = array
    failed, finished = [], []

    def done(i: int, summary, error) -> None:
        finished.append(i)
        line = describe(summary) if error is None else f"failed: {one_line(error)}"
        say(f"  [{len(finished)}/{len(items)}] {names[i]}: {line}")
        if error is not None:
            failed.append(f"{names[i]} ({one_line(error)})")

    run_array(task, [(*item, opt) for item in items], cluster, params, done, "sam-landscape")
    if failed:
        raise TasksFailed(f"{len(failed)} of {len(items)} task(s) failed: {'; '.join(failed)}")
    return {"failed": 0}


def _rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _width(s: dict) -> str:
    return f"basin width {_fmt(s.get('basin_width_1d'))}"


def _barriers(s: dict) -> str:
    return (
        f"barrier train loss {_fmt(s.get('barrier_train_loss'))}, "
        f"test error {_fmt(s.get('barrier_test_error'))}"
    )
