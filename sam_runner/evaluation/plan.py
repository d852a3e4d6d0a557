"""Which job folders ``sam-eval PATH`` measures.

PATH is a run folder (it holds ``.hydra/`` or ``summary.json`` itself) or a sweep folder (every
job folder under it, as ``runfiles.job_dirs`` finds them). Each job is

- ``measure``: completed (summary.json says so), and its eval.json is absent, failed, made
  with other settings, older than the checkpoint (the job was trained again), or corrupt (the
  reason names it, and the header says so: it is measured again and replaced);
- ``done``: its eval.json was made with these settings, after the checkpoint was last written
  (skipped: a rerun finishes the rest);
- ``skip``: not completed (failed, diverged, running, killed): nothing to measure.

Before anything is measured, every job to measure is checked against the settings: its config
is readable and the settings apply to it (corruptions to its dataset); a refusal is one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError, require
from ..rundir import AVERAGED, CHECKPOINT, RunDir, eval_file
from ..runfiles import json_problem, read_json

if TYPE_CHECKING:
    from omegaconf import DictConfig
from .paths import job_folders

EVAL_FILE = eval_file("last")


@dataclass
class PlannedJob:
    """What sam-eval does about one job folder (the job itself: ``rundir.RunDir``)."""

    path: Path
    name: str  # relative to PATH ("." for a run folder)
    state: str  # measure | done | skip
    reason: str = ""


def plan(path: Path, settings: dict, weights: str = "last") -> list[PlannedJob]:
    """Every job of PATH with what to do about it, in natural order (``weights``: which of the
    job's weights, into which file: eval.json, or eval_averaged.json for averaged.pt)."""
    path = Path(path)
    jobs = []
    for d in job_folders(path):
        name = str(d.relative_to(path)) if d != path else "."
        summary = RunDir(d).summary or {}
        if summary.get("status") != "completed":
            status = summary.get("status") or RunDir(d).missing_reason
            jobs.append(PlannedJob(d, name, "skip", f"not completed ({status})"))
            continue
        require(
            weights != "averaged" or (d / AVERAGED).is_file(),
            f"job {name} has no averaged weights ({d / AVERAGED}); train it with "
            "trainer.weight_averaging=swa or ema, or measure eval.weights=last",
        )
        done = read_json(d / eval_file(weights)) or {}
        fresh_ = fresh(d, weights)
        if done.get("status") == "completed" and done.get("eval_settings") == settings and fresh_:
            jobs.append(PlannedJob(d, name, "done", "already measured with these settings"))
        else:
            problem = json_problem(d / eval_file(weights))
            corrupt = f"its {eval_file(weights)} is {problem}" if problem != "missing" else ""
            jobs.append(PlannedJob(d, name, "measure", corrupt if done == {} else ""))
    require(
        any(j.state != "skip" for j in jobs),
        f"PATH={str(path)!r} holds no completed run to measure "
        f"({'; '.join(f'{j.name}: {j.reason}' for j in jobs[:3])})",
    )
    return jobs


def fresh(job_dir: Path, weights: str = "last") -> bool:
    """Whether the job's eval file is newer than its weights (a job trained again since it was
    measured is measured again)."""
    source = CHECKPOINT if weights == "last" else AVERAGED
    try:
        measured = (job_dir / eval_file(weights)).stat().st_mtime_ns
        return (job_dir / source).stat().st_mtime_ns <= measured
    except OSError:
        return False


def check_jobs(jobs: list[PlannedJob], metrics_cfg: DictConfig) -> None:
    """One line for the first job the settings do not apply to (corruptions to its dataset): bad
    input, refused before anything runs. A job that cannot be measured (its config or checkpoint
    unreadable or missing) is not refused here: it fails, into its eval.json, and the rest go on."""
    from ..metrics.robustness import validate as validate_corruptions

    for job in jobs:
        if job.state != "measure":
            continue
        try:
            cfg = RunDir(job.path).omega_config("sam-eval")
        except UserError:
            continue
        try:
            validate_corruptions(metrics_cfg, cfg.dataset)
        except UserError as e:
            raise UserError(f"job {job.name}: {e}") from None
