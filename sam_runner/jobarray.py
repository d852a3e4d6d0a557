"""One task of a submitit job array per item (a job folder, a pair of job folders), for the
commands that look at finished runs (``sam-eval``, ``sam-landscape``), with the launcher preset
that training uses: ``slurm`` (conf/hydra/launcher/slurm.yaml: partition, time limit, GPUs,
``array_parallelism``, requeue on timeout) or ``submitit_local`` (the same array as local
processes, for trying it without a cluster).

A task requeued after a timeout or a preemption starts its item again from the beginning: each
item is minutes of work that writes its result file only when it ends.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .errors import require
from .sweep import hydra_api

if TYPE_CHECKING:
    from typing import Any

    import submitit

CLUSTERS = {"slurm": "slurm", "submitit_local": "local"}  # launcher preset -> submitit cluster


def cluster_of(target: str | None) -> str | None:
    """The submitit cluster of a Hydra launcher's ``_target_``; None for a non-array launcher."""
    target = str(target or "")
    if target.endswith("SlurmLauncher"):
        return "slurm"
    return "local" if target.endswith("LocalLauncher") else None


def check_cluster(cluster: str | None, name: str) -> None:
    """SLURM needs sbatch here (the login node): say so before anything is submitted."""
    import shutil

    require(
        cluster != "slurm" or shutil.which("sbatch") is not None,
        f"{name} needs SLURM's sbatch on PATH, and it is not; run on a SLURM login node or "
        "run locally",
    )


class TasksFailed(Exception):
    """Some tasks of an array failed (the others' results are written)."""


class Task:
    """One array task: ``fn(*args)``. Requeued as it was on a timeout or preemption (submitit
    calls ``checkpoint``)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The task resubmitted as it was (submitit calls it on a timeout or preemption)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def executor(cluster: str, params: dict) -> submitit.AutoExecutor:
    """A submitit executor with the launcher preset's parameters: submitit's own names for the
    ones every cluster shares, ``<cluster>_<name>`` for the others (as its API asks)."""
    import submitit

    params = {k: v for k, v in params.items() if k != "_target_"}
    folder = params.pop("submitit_folder")
    timeouts = params.pop("max_num_timeout", None)
    init = (
        {"slurm_max_num_timeout": timeouts} if cluster == "slurm" and timeouts is not None else {}
    )
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster, **init)
    shared = hydra_api.submitit_shared_parameters()
    ex.update_parameters(**{k if k in shared else f"{cluster}_{k}": v for k, v in params.items()})
    return ex


def run_array(
    fn: Callable,
    items: list[tuple],
    cluster: str,
    params: dict,
    done: Callable[[int, object, Exception | None], None],
    prog: str,
) -> None:
    """``fn(*item)`` for each item, one array task each; ``done(index, result, error)`` as each
    task ends (``error``: what the task raised, or why it died), in the order they end."""
    ex = executor(cluster, dict(params))
    tasks = ex.map_array(Task(fn), *(list(column) for column in zip(*items)))
    print(
        f"{prog}: submitted {len(tasks)} task(s) ({tasks[0].job_id.split('_')[0]}); "
        f"their logs: {Path(params['submitit_folder']).parent}",
        file=sys.stderr,
        flush=True,
    )
    pending = dict(enumerate(tasks))
    while pending:
        for i, task in list(pending.items()):
            if task.done():
                try:
                    result, error = task.result(), None
                except Exception as e:  # it raised, died or was cancelled
                    result, error = None, e
                done(i, result, error)
                del pending[i]
        if pending:
            time.sleep(0.5)
