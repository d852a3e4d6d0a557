"""The settings of ``sam-eval``: conf/eval.yaml composed with the command's overrides by Hydra's
own compose (``sweep.plan.compose``), checked whole before anything is measured, with one-line
errors for whatever is refused.

How a job's config and the eval settings combine (our choice): the eval settings alone say how
to measure (the ``metrics`` group and keys, composed exactly as training composes them, from
``metrics=default`` unless the command says otherwise); a job's stored config says only what was
trained (dataset, model, seed, label noise). So every job of a sweep is measured alike, whatever
each job measured while it trained, which is what comparing measures across jobs needs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from ..cli_words import check_device, check_progress
from ..command_config import compose_command
from ..errors import integer, require
from ..jobarray import check_cluster, cluster_of
from ..settings import flatten

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONFIG = "eval"
FORMAT = 1  # what eval.json holds; a change of what is computed bumps it (and measures again)


def compose_eval(overrides: list[str], path: Path) -> DictConfig:
    """The eval config of ``sam-eval PATH overrides`` (Hydra's part included), checked."""
    cfg = compose_command(CONFIG, overrides, Path(path) / ".sam-eval")
    check(cfg)
    return cfg


def check(cfg: DictConfig) -> None:
    """Every eval key, as a run checks its own (the metrics keys: ``check_metrics``)."""
    e = cfg.eval
    integer("eval.workers", e.workers, "an integer >= 1", lambda w: w >= 1)
    devices = cfg.trainer.get("devices", 1)
    integer("trainer.devices", devices, "an integer >= 1", lambda d: d >= 1)
    require(
        devices == 1 or (e.workers == 1 and launcher(cfg) == "local"),
        f"trainer.devices={devices} (processes measuring each job together) goes with "
        "eval.workers=1 and the local launcher; choose one way to use the processes",
    )
    device = check_device(cfg.trainer.device)
    check_progress(cfg.trainer.progress)
    cores = usable_cores()
    if e.workers > cores and launcher(cfg) == "local":  # more processes than cores: no faster
        print(
            f"sam-eval: warning: eval.workers={e.workers} is more than the {cores} CPU core(s) "
            f"this process may use: capped at {cores} worker process(es)",
            file=sys.stderr,
        )
        e.workers = cores
    from ..rundir import check_weights

    check_weights(str(e.get("weights", "last")), "eval.weights")
    check_cluster("slurm" if launcher(cfg) == "slurm" else None, "hydra/launcher=slurm")
    if device.startswith("cuda"):
        import torch

        require(
            torch.cuda.is_available(), f"trainer.device={device}, but no CUDA device is visible"
        )


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: cgroups, taskset, SLURM's binding;
    no more than ``SLURM_CPUS_PER_TASK`` where set): the most worker processes that run at once.
    Not ``OMP_NUM_THREADS``, which counts the threads of one process, not processes."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cores = min(cores or 1, int(slurm))
    return max(1, cores or 1)


def check_metrics(cfg: DictConfig) -> None:
    """Every metrics key, as a run checks its own. The checks import torch: made only when a
    job is to be measured (a job already measured was measured with these same settings)."""
    from ..metrics.robustness import validate as validate_corruptions
    from ..metrics.tracker import validate as validate_metrics

    validate_metrics(cfg.metrics)
    validate_corruptions(cfg.metrics)


def launcher(cfg: DictConfig) -> str:
    """``local`` (this machine: in this process, or a pool of eval.workers processes), ``slurm``
    (a SLURM array through submitit), or ``submitit`` (submitit's local processes)."""
    cluster = cluster_of(OmegaConf.select(cfg, "hydra.launcher._target_"))
    return {"slurm": "slurm", "local": "submitit"}.get(cluster, "local")


def eval_settings(cfg: DictConfig) -> dict:
    """What a measurement depends on, written into eval.json: the metrics settings as dotted
    keys, and the format of eval.json. Not the workers, device, progress or launcher: how it
    runs, not what it computes (as ``settings.RUN_ONLY_KEYS`` for a run)."""
    metrics = OmegaConf.to_container(cfg.metrics, resolve=True)
    return {"format": FORMAT, **flatten(metrics, "metrics.")}


def plain(cfg: DictConfig) -> dict:
    """The settings a job needs, as plain data (sent to worker processes and SLURM tasks)."""
    return {
        "metrics": OmegaConf.to_container(cfg.metrics, resolve=True),
        "eval": OmegaConf.to_container(cfg.eval, resolve=True),
        "trainer": OmegaConf.to_container(cfg.trainer, resolve=True),
        "eval_settings": eval_settings(cfg),
    }
