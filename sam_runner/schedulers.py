"""Learning-rate schedules, stepped once per optimizer step (linear warmup, then the shape)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .errors import number, require

SCHEDULERS = ("cosine", "multistep", "constant")


def lr_factor(cfg, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """The multiplier of the base learning rate after ``step`` optimizer steps."""
    warmup = int(round(float(cfg.get("warmup_epochs", 0)) * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    if cfg.name == "cosine":
        t = (step - warmup) / max(1, total_steps - warmup)
        floor = float(cfg.get("min_lr_ratio", 0.0))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    if cfg.name == "multistep":
        epoch = step / steps_per_epoch
        return float(cfg.get("gamma", 0.1)) ** sum(epoch >= m for m in cfg.get("milestones", []))
    return 1.0


def validate(cfg) -> None:
    """One-line errors for the keys ``lr_factor`` reads (an absent key takes its default)."""
    require(cfg.name in SCHEDULERS, f"scheduler={cfg.name!r} is unknown; choose one of {', '.join(SCHEDULERS)}")
    number("scheduler.warmup_epochs", cfg.get("warmup_epochs", 0), "a number of epochs >= 0",
           lambda e: 0 <= e < math.inf)
    if cfg.name == "cosine":
        number("scheduler.min_lr_ratio", cfg.get("min_lr_ratio", 0.0), "a fraction in [0, 1]", lambda r: 0 <= r <= 1)
    if cfg.name == "multistep":
        number("scheduler.gamma", cfg.get("gamma", 0.1), "a finite number > 0", lambda g: 0 < g < math.inf)
        ms = cfg.get("milestones", [])
        ok = isinstance(ms, Sequence) and not isinstance(ms, str) and all(
            isinstance(m, (int, float)) and not isinstance(m, bool) and m >= 0 for m in ms)
        require(ok, f"scheduler.milestones={ms!r} must be a list of epochs >= 0, e.g. [60, 120, 160]")


def build_scheduler(cfg, optimizer, steps_per_epoch: int, total_steps: int):
    validate(cfg)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(cfg, step, steps_per_epoch, total_steps))
