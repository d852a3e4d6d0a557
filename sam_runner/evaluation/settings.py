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

import difflib
import os
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ..errors import UserError, first_line, integer, require
from ..jobarray import check_cluster, cluster_of
from ..preflight import config_paths, unknown_option
from ..settings import flatten

CONFIG = "eval"
FORMAT = 1  # what eval.json holds; a change of what is computed bumps it (and measures again)
DEVICES = ("auto", "cpu", "cuda")
PROGRESS = ("auto", "bar", "lines", "none")


def compose_eval(overrides: list[str], path: Path):
    """The eval config of ``sam-eval PATH overrides`` (Hydra's part included), checked."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )

    from ..sweep.plan import compose

    folder = [f"hydra.sweep.dir={Path(path).absolute() / '.sam-eval'}"]
    try:
        cfg = compose([*overrides, *folder], CONFIG)
    except OverrideParseException as e:
        raise UserError(
            f"{e.override} is not a valid override ({first_line(e.message)}); see "
            "https://hydra.cc/docs/advanced/override_grammar/basic/"
        ) from None
    except MissingConfigException as e:
        raise UserError(unknown_option(e)) from None
    except ConfigCompositionException as e:
        bad = re.match(r"Could not override '([^']+)'", str(e))
        if bad is None:
            raise UserError(first_line(str(e.__cause__ or e))) from None
        raise UserError(_unknown_key(bad.group(1), overrides, folder)) from None
    check(cfg)
    return cfg


def _unknown_key(key: str, overrides: list[str], folder: list[str]) -> str:
    """``metrics.hessian.kk is not a key; did you mean metrics.hessian.k?`` (the keys of the
    config without the override), else the keys of its section."""
    from ..settings import override_key
    from ..sweep.plan import compose

    try:
        cfg = compose([o for o in overrides if override_key(o) != key] + folder, CONFIG)
    except Exception:
        return f"{key} is not a key of sam-eval's settings; `metrics.*` and `eval.*` are"
    tree = {k: v for k, v in OmegaConf.to_container(cfg).items() if k != "hydra"}
    keys = config_paths(tree)
    near = difflib.get_close_matches(key, keys, n=1)
    if near:
        return f"{key} is not a key; did you mean {near[0]}?"
    return f"{key} is not a key; sam-eval's keys are metrics.* and eval.* ({', '.join(tree)})"


def check(cfg) -> None:
    """Every eval key, as a run checks its own (the metrics keys: ``check_metrics``)."""
    e = cfg.eval
    integer("eval.workers", e.workers, "an integer >= 1", lambda w: w >= 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if e.device != "cuda" and e.workers > (cores or 1):  # legal: each gets part of a core
        print(
            f"sam-eval: warning: eval.workers={e.workers} is more than this machine's {cores} "
            "CPU core(s): the workers share them and run no faster",
            file=sys.stderr,
        )
    require(e.device in DEVICES, f"eval.device={e.device!r} is unknown; choose auto, cpu or cuda")
    require(
        e.progress in PROGRESS,
        f"eval.progress={e.progress!r} is unknown; choose one of {', '.join(PROGRESS)}",
    )
    from ..rundir import check_weights

    check_weights(str(e.get("weights", "last")), "eval.weights")
    check_cluster("slurm" if launcher(cfg) == "slurm" else None, "hydra/launcher=slurm")
    if e.device == "cuda":
        import torch

        require(torch.cuda.is_available(), "eval.device=cuda, but no CUDA device is visible")


def check_metrics(cfg) -> None:
    """Every metrics key, as a run checks its own. The checks import torch: made only when a
    job is to be measured (a job already measured was measured with these same settings)."""
    from ..metrics.robustness import validate as validate_corruptions
    from ..metrics.tracker import validate as validate_metrics

    validate_metrics(cfg.metrics)
    validate_corruptions(cfg.metrics)


def launcher(cfg) -> str:
    """``local`` (this machine: in this process, or a pool of eval.workers processes), ``slurm``
    (a SLURM array through submitit), or ``submitit`` (submitit's local processes)."""
    cluster = cluster_of(OmegaConf.select(cfg, "hydra.launcher._target_"))
    return {"slurm": "slurm", "local": "submitit"}.get(cluster, "local")


def eval_settings(cfg) -> dict:
    """What a measurement depends on, written into eval.json: the metrics settings as dotted
    keys, and the format of eval.json. Not the workers, device, progress or launcher: how it
    runs, not what it computes (as ``settings.RUN_ONLY_KEYS`` for a run)."""
    metrics = OmegaConf.to_container(cfg.metrics, resolve=True)
    return {"format": FORMAT, **flatten(metrics, "metrics.")}


def plain(cfg) -> dict:
    """The settings a job needs, as plain data (sent to worker processes and SLURM tasks)."""
    return {
        "metrics": OmegaConf.to_container(cfg.metrics, resolve=True),
        "eval": OmegaConf.to_container(cfg.eval, resolve=True),
        "eval_settings": eval_settings(cfg),
    }
