"""The job folders of ``sam-eval PATH``, found with nothing heavy imported (no Hydra, no torch):
a PATH that is no folder, or holds no run, is refused before the settings are composed."""

from __future__ import annotations

from pathlib import Path

from ..errors import require
from ..rundir import is_run, job_dirs, require_sam_run_jobs


def job_folders(path: Path) -> list[Path]:
    """The job folders of ``PATH``: itself (a run folder), else the jobs under it (a sweep
    folder); a one-line error for anything else."""
    path = Path(path)
    require(
        path.is_dir(),
        f"PATH={str(path)!r} is not a folder; pass a run folder or a sweep folder of sam-run",
    )
    if is_run(path):
        require_sam_run_jobs(path, [path])
        return [path]
    dirs = job_dirs(path)
    require(
        bool(dirs),
        f"PATH={str(path)!r} holds no run: no .hydra/ or summary.json in it or in a folder under "
        "it; pass a run folder or a sweep folder of sam-run",
    )
    require_sam_run_jobs(path, dirs)
    return dirs
