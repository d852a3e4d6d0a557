"""Periodic settings that can never act within a run's length: one notice each, before it runs.

A period longer than the run (OUIDecay's ``weight_decay.every_n_steps``, a step-level curvature
period, an evaluation or checkpoint period), EMA's decay ramp longer than the run (the learning
rate's warm-up is said by ``validate.warnings``), or a late phase that starts at the end
(``perturb_from``) leaves the run as if the setting were absent, and used to say nothing.
The run's length in steps follows from its epochs (or
``trainer.steps``) and its steps per epoch: the training examples (read up front as the checks
read them, ``data/planned.py``) over the batch size; where those are not known before the run
(data to download, several processes, a federated run's rounds) the step-based notices are left
out rather than guessed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

if TYPE_CHECKING:
    from omegaconf import DictConfig


def run_steps(cfg: DictConfig) -> tuple[int | None, int | None]:
    """(the run's epochs, its optimizer steps) as far as they are known before it runs; None
    where not."""
    steps = cfg.trainer.get("steps")
    per_epoch = steps_per_epoch(cfg)
    if steps:
        epochs = -(-int(steps) // per_epoch) if per_epoch else None
        return epochs, int(steps)
    epochs = int(cfg.trainer.epochs)
    return epochs, epochs * per_epoch if per_epoch else None


def steps_per_epoch(cfg: DictConfig) -> int | None:
    """An epoch's optimizer steps on one process (the last partial batch dropped, as the
    training loader does); None where the data is not known up front."""
    from .data.labels import batch_size
    from .data.planned import planned_labels

    d = cfg.dataset
    if d.get("steps_per_epoch"):  # token windows: the epoch's length is a setting
        return int(d.steps_per_epoch)
    if int(cfg.trainer.get("devices", 1) or 1) != 1:
        return None
    labels = planned_labels(d, int(cfg.seed))
    if labels is None:
        return None
    n = len(labels)
    return n // batch_size(d, n) or None


def never_acting(cfg: DictConfig) -> list[str]:
    """One line for each periodic setting of ``cfg`` that never acts within the run."""
    if str(OmegaConf.select(cfg, "federated.name", default="none")) != "none":
        return []  # a federated run's periods are its rounds (checked with the federation)
    known: dict = {}

    def length():  # the labels are read once, and only when a setting needs the length
        if not known:
            known["epochs"], known["steps"] = run_steps(cfg)
        return known["epochs"], known["steps"]

    out = []
    for check in (_ouidecay, _curvature, _evaluation, _checkpoints, _ema, _late):
        line = check(cfg, length)
        if line:
            out.append(line)
    return out


def _ouidecay(cfg, length) -> str | None:
    wd = cfg.get("weight_decay") or {}
    if str(wd.get("name", "constant")) != "ouidecay":
        return None
    every, (_, steps) = int(wd.get("every_n_steps", 256)), length()
    if steps is None or steps >= every:
        return None
    return (
        f"weight_decay=ouidecay rescales every {every} steps (weight_decay.every_n_steps) and "
        f"this run trains {steps}: no layer's weight decay is ever rescaled, every layer keeps "
        f"base_optimizer.weight_decay; set weight_decay.every_n_steps below {steps}"
    )


def _curvature(cfg, length) -> str | None:
    h = OmegaConf.select(cfg, "metrics.hessian") or {}
    if not h.get("enabled"):
        return None
    every = int(h.get("every_n_steps", 0) or 0)
    epochs, steps = length() if every else (None, None)
    if every and steps is not None and every > steps:
        return (
            f"metrics.hessian.every_n_steps={every} is more than this run's {steps} steps: no "
            "step-level measurement is made (lambda_max is measured at epoch ends only)"
        )
    per_epochs = int(h.get("every_n_epochs", 0) or 0)
    epochs = int(cfg.trainer.epochs) if not cfg.trainer.get("steps") else None
    if per_epochs > 1 and epochs is not None and per_epochs > epochs:
        return (
            f"metrics.hessian.every_n_epochs={per_epochs} is more than trainer.epochs={epochs}: "
            "lambda_max is measured at the run's end only"
        )
    return None


def _evaluation(cfg, length) -> str | None:
    every = cfg.trainer.get("eval_every_n_steps")
    if not every:
        return None
    _, steps = length()
    if steps is None or int(every) <= steps:
        return None
    return (
        f"trainer.eval_every_n_steps={every} is more than this run's {steps} steps: only the "
        "last epoch is evaluated (and checkpointed)"
    )


def _checkpoints(cfg, length) -> str | None:
    every = cfg.trainer.get("checkpoint_every_n_steps")
    if not every:
        return None
    _, steps = length()
    if steps is None or int(every) < steps:
        return None
    return (
        f"trainer.checkpoint_every_n_steps={every} is at least this run's {steps} steps: no "
        "checkpoint is written within an epoch, only those of its evaluations"
    )


def ema_reached_at(decay: float) -> int:
    """The first update t whose warm-up decay (1 + t)/(10 + t) reaches ``decay``."""
    return max(1, math.ceil((10 * decay - 1) / (1 - decay) - 1e-9))


def _ema(cfg, length) -> str | None:
    t = cfg.trainer
    if str(t.get("weight_averaging", "none")) != "ema" or not t.get("ema_warmup", True):
        return None
    decay = t.get("ema_decay", 0.999)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
        return None  # not a decay: the checks that follow say so in one line
    at, (_, steps) = ema_reached_at(decay), length()
    if steps is None or steps > at:  # the first step copies; the t-th update is step t + 1
        return None
    return (
        f"trainer.ema_decay={decay} is never reached: with trainer.ema_warmup the t-th update "
        f"uses (1 + t)/(10 + t), which reaches {decay} at update {at}, and this run makes "
        f"{max(steps - 1, 0)}; set trainer.ema_warmup=false or a lower trainer.ema_decay"
    )


def _late(cfg, _length) -> str | None:
    o = cfg.optimizer
    if str(o.get("perturb_schedule", "every")) != "late":
        return None
    start = o.get("perturb_from", 0.0)
    if not (isinstance(start, float) and start >= 1.0):
        return None
    return (
        f"optimizer.perturb_from={start} with optimizer.perturb_schedule=late starts at the end "
        "of training: no step is perturbed, and the run trains as optimizer=base"
    )
