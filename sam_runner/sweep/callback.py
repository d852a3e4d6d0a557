"""The Hydra callback of every ``sam-run``: checks before anything runs, a report at the end.

``SweepCallback`` (registered in conf/config.yaml ``hydra.callbacks``): before any job of a
sweep runs it refuses a sweep folder that holds jobs of a different sweep, and the SLURM
launcher without ``sbatch``; before a single run, a run folder holding a run made with other
overrides (before Hydra rewrites its .hydra/); after the last job it prints one line per job
(number, status, test accuracy, overrides) and exits non-zero naming failed jobs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf
from typing_extensions import override

from .. import interrupts
from ..errors import UserError
from ..lock import held_by
from ..rundir import RunDir, job_dirs
from .plan import (
    check_folder,
    check_job,
    check_run_folder,
    exclude_keys,
    expand,
    expected_jobs,
    knows_jobs,
    saved_overrides,
)

if TYPE_CHECKING:
    from typing import Any, NoReturn

    from omegaconf import DictConfig


def report(sweep_dir: Path | str, n_jobs: int | None = None) -> tuple[list[str], list[str]]:
    """One line per job (number, status, test accuracy, overrides), and the failed jobs'
    descriptions.
    """
    dirs = {
        int(p.name): p
        for p in job_dirs(sweep_dir)
        if p.parent == Path(sweep_dir) and p.name.isdigit()
    }
    if n_jobs is None:  # as many as the sweep calls for, when its multirun.yaml says
        expected = expected_jobs(sweep_dir)
        n_jobs = len(expected) if expected is not None else None
    numbers = range(max(n_jobs, max(dirs, default=-1) + 1)) if n_jobs is not None else sorted(dirs)
    jobs = []
    for num in numbers:
        d = dirs.get(num, Path(sweep_dir) / str(num))
        summary = RunDir(d).summary or {}
        overrides = summary.get("overrides")
        jobs.append((num, d, summary, saved_overrides(d) if overrides is None else overrides))
    # show what varies between jobs; the overrides every job shares are noise here
    known = [set(j[3]) for j in jobs if j[3]]
    shared = set.intersection(*known) if len(known) > 1 else set()
    lines, failed = [], []
    for num, d, summary, overrides in jobs:
        varying = None if overrides is None else " ".join(o for o in overrides if o not in shared)
        # None: the job left nothing to read its overrides from, which is not "no overrides"
        label = varying or ("overrides unknown" if overrides is None else "defaults")
        status = summary.get("status") or ("missing" if not d.exists() else "incomplete")
        holder = held_by(d, "train") if status == "incomplete" else None
        if holder:  # another process (an identical sweep) is training it: not a failure here
            status, summary = "running", {**summary, "error": f"trained by {holder}"}
        key = "test_bpd" if "test_bpd" in summary else "test_acc"  # a density model's bits
        acc = summary.get(key)
        acc = f"{acc:.4f}" if isinstance(acc, (int, float)) else "-"
        line = f"#{num:<3} {status:<10} {key}={acc:<7} {varying or f'({label})'}"
        if summary.get("error"):
            line += f"  [{summary['error']}]"
        lines.append(line)
        # a divergence is a result, so is a trial the search pruned, and a job another
        # process trains is not ours to count
        if status not in ("completed", "diverged", "pruned", "running"):
            failed.append(f"#{num} ({status}: {label})")
    return lines, failed


def print_report(
    lines: list[str], failed: list[str], indent: str = "", prog: str = "sam-run"
) -> None:
    """The job lines, then (exit 1) the jobs that failed or did not finish."""
    for line in lines:
        print(indent + line, flush=True)
    if failed:
        fail(
            f"{len(failed)} of {len(lines)} job(s) failed or did not finish: {'; '.join(failed)}",
            1,
            prog,
        )


def fail(message: str, code: int = 2, prog: str = "sam-run") -> NoReturn:
    """Print ``prog: error: message`` and exit with ``code`` (a callback's exceptions are only
    warnings to Hydra)."""
    # a callback's exceptions are only warnings to Hydra; SystemExit is not an Exception
    interrupts.raise_pending()  # a signal a library turned into an error
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class SweepCallback(Callback):
    """Checks a sweep before it starts and reports it when it ends (see the module docstring)."""

    def __init__(self) -> None:
        self.jobs: list[list[str]] | None = None

    @override
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Refuse a launcher that cannot run here, check the sweep folder against the jobs, and
        leave completed jobs out."""
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if launcher.endswith("SlurmLauncher") and shutil.which("sbatch") is None:
            fail(
                "hydra/launcher=slurm needs SLURM's sbatch on PATH, and it is not; run on a SLURM "
                "login node or use the local launcher (drop hydra/launcher=slurm)"
            )
        if not knows_jobs(OmegaConf.select(config, "hydra.sweeper._target_", default="")):
            return  # job numbers of other sweepers are not known in advance
        arguments = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        params = OmegaConf.select(config, "hydra.sweeper.params")
        params = OmegaConf.to_container(params, resolve=False) if params else {}
        try:
            self.jobs = expand(arguments, params)
            check_folder(config.hydra.sweep.dir, self.jobs, _exclude(config))
        except UserError as e:
            fail(str(e))

    @override
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Refuse a run folder that holds another job's run, before Hydra rewrites its
        ``.hydra/``."""
        # before Hydra rewrites <run dir>/.hydra/ with this run's config
        run_dir = Path(str(config.hydra.run.dir))
        overrides = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        try:
            # a job of an sbatch array (scripts/slurm_array.sbatch): <sweep dir>/<number>
            if run_dir.name.isdigit():
                check_job(run_dir, overrides, _exclude(config), run_dir.parent)
            else:
                check_run_folder(run_dir, overrides, _exclude(config))
        except UserError as e:
            fail(str(e))

    @override
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """One line per job and the sweep's closing line."""
        sweep_dir = str(config.hydra.sweep.dir)
        lines, failed = report(sweep_dir, len(self.jobs) if self.jobs is not None else None)
        print(closing_line(sweep_dir, lines, failed), flush=True)
        print_report(lines, failed, "  ")


def closing_line(sweep_dir: str, lines: list[str], failed: list[str]) -> str:
    """``sweep DIR: N job(s), C completed[, P pruned][, R running ...]`` above the job lines: a
    job another process (an identical sweep) still trains is counted as running, not done."""
    count = lambda status: sum(1 for line in lines if line.split()[1:2] == [status])  # noqa: E731
    pruned, running = count("pruned"), count("running")
    done = f"{len(lines) - len(failed) - pruned - running} completed"
    done += f", {pruned} pruned" if pruned else ""
    done += f", {running} running in another process" if running else ""
    return f"sweep {sweep_dir}: {len(lines)} job(s), {done}"


def _exclude(config) -> tuple:
    return exclude_keys(config)
