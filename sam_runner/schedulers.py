"""Learning-rate schedules, stepped once per optimizer step (linear warmup, then the shape)."""
from __future__ import annotations

import math

import torch

from .errors import require

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


def build_scheduler(cfg, optimizer, steps_per_epoch: int, total_steps: int):
    require(cfg.name in SCHEDULERS, f"scheduler={cfg.name!r} is unknown; choose one of {', '.join(SCHEDULERS)}")
    require(float(cfg.get("warmup_epochs", 0)) >= 0, f"scheduler.warmup_epochs={cfg.warmup_epochs} must be >= 0")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(cfg, step, steps_per_epoch, total_steps))
