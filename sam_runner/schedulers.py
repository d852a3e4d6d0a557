"""Learning-rate schedules (``scheduler=<name>``), stepped once per optimizer step: a linear
warmup over ``warmup_epochs``, then the schedule's shape, as a factor of the base lr."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .errors import number, require
from .registry import SCHEDULERS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from omegaconf import DictConfig


def _cosine_keys(cfg) -> None:
    number(
        "scheduler.min_lr_ratio",
        cfg.get("min_lr_ratio", 0.0),
        "a fraction in [0, 1]",
        lambda r: 0 <= r <= 1,
    )


def _multistep_keys(cfg) -> None:
    number(
        "scheduler.gamma", cfg.get("gamma", 0.1), "a finite number > 0", lambda g: 0 < g < math.inf
    )
    ms = cfg.get("milestones", [])
    ok = (
        isinstance(ms, Sequence)
        and not isinstance(ms, str)
        and all(isinstance(m, (int, float)) and not isinstance(m, bool) and m >= 0 for m in ms)
    )
    require(ok, f"scheduler.milestones={ms!r} must be a list of epochs >= 0, e.g. [60, 120, 160]")
    # the order changes nothing (lr × gamma^(milestones passed)), so [5, 2] is almost surely a slip
    listed = lambda epochs: f"[{', '.join(f'{m:g}' for m in epochs)}]"  # noqa: E731
    require(
        all(a < b for a, b in zip(ms, list(ms)[1:])),
        f"scheduler.milestones={listed(ms)} must be increasing epochs, each later than the one "
        f"before, e.g. {listed(sorted(set(ms)))}",
    )


@dataclass(frozen=True)
class Position:
    """Where training is: after ``step`` optimizer steps, with ``warmup`` warmup steps."""

    step: int
    warmup: int
    steps_per_epoch: int
    total_steps: int


@SCHEDULERS.register(
    "cosine", "cosine decay from lr to min_lr_ratio·lr over training", check=_cosine_keys
)
def cosine(cfg: Mapping[str, Any], at: Position) -> float:
    """Cosine decay after warmup, to ``min_lr_ratio`` at the last step."""
    t = (at.step - at.warmup) / max(1, at.total_steps - at.warmup)
    floor = float(cfg.get("min_lr_ratio", 0.0))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


@SCHEDULERS.register("multistep", "lr × gamma at each epoch of milestones", check=_multistep_keys)
def multistep(cfg: Mapping[str, Any], at: Position) -> float:
    """``gamma`` to the power of the milestones (epochs) passed."""
    epoch = at.step / at.steps_per_epoch
    return float(cfg.get("gamma", 0.1)) ** sum(epoch >= m for m in cfg.get("milestones", []))


@SCHEDULERS.register("constant", "the base lr throughout (after the warmup)")
def constant(_cfg: Mapping[str, Any], _at: Position) -> float:
    """1: the base learning rate throughout (after warmup)."""
    return 1.0


def lr_factor(cfg: DictConfig, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """The multiplier of the base learning rate after ``step`` optimizer steps."""
    warmup = int(round(float(cfg.get("warmup_epochs", 0)) * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    return SCHEDULERS[cfg.name](cfg, Position(step, warmup, steps_per_epoch, total_steps))


def validate(cfg: DictConfig) -> None:
    """One-line errors for the keys ``lr_factor`` reads (an absent key takes its default)."""
    entry = SCHEDULERS.entry(cfg.name)
    number(
        "scheduler.warmup_epochs",
        cfg.get("warmup_epochs", 0),
        "a number of epochs >= 0",
        lambda e: 0 <= e < math.inf,
    )
    if entry.meta.get("check"):
        entry.check(cfg)


class _Plain(dict):
    """The scheduler's keys as plain values, read like the config (``cfg.name``, ``cfg.get``)."""

    __getattr__ = dict.__getitem__


def schedule_factor(
    cfg: DictConfig | Mapping[str, Any], steps_per_epoch: int, total_steps: int
) -> Callable[[int], float]:
    """``lr_factor`` as a closure over plain values: the config is read once, here, never in a
    step (LambdaLR calls it once per parameter group and step)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = _Plain(OmegaConf.to_container(cfg, resolve=True))
    warmup = int(round(float(cfg.get("warmup_epochs", 0)) * steps_per_epoch))
    shape = SCHEDULERS[cfg.name]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return shape(cfg, Position(step, warmup, steps_per_epoch, total_steps))

    return factor


class StepLambdaLR(torch.optim.lr_scheduler.LambdaLR):
    """``LambdaLR`` whose every step but the first does only what LambdaLR's does to the
    learning rates (lr = base lr × factor(step), the same floats): no context manager, ordering
    check or per-group copy, for a step the runner takes after every optimizer step."""

    def step(self, epoch: int | None = None) -> None:
        """LambdaLR's step (its checks on the first; an ``epoch`` or tensor lr: its own way)."""
        groups = self.optimizer.param_groups
        if epoch is not None or self._step_count <= 1 or self._tensor_lr(groups):
            super().step(epoch)
            return
        self._step_count += 1
        self.last_epoch += 1
        lrs = [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]
        for group, lr in zip(groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = lrs

    @staticmethod
    def _tensor_lr(groups: list[dict]) -> bool:
        return any(isinstance(g["lr"], torch.Tensor) for g in groups)


def build_scheduler(
    cfg: DictConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``LambdaLR`` of the configured schedule, keys checked."""
    validate(cfg)
    factor = schedule_factor(cfg, steps_per_epoch, total_steps)
    return StepLambdaLR(optimizer, factor)
