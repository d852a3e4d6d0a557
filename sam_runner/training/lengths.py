"""What a run reads of its config once, before it trains: its length and its precision."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, NamedTuple

import torch

from .fast_path import resolved_precision

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..data import Data

# the autocast type of each of settings.PRECISIONS
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of ``trainer.precision`` on ``device`` (none for fp32; ``auto``
    resolved for the device, ``fast_path.resolved_precision``)."""
    dtype = DTYPES[resolved_precision(precision, device)]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


class Lengths(NamedTuple):
    """A run's length: scheduler steps (an epoch's, the run's) and optimizer steps (the run's,
    an epoch's)."""

    steps_per_epoch: int
    total_steps: int
    optimizer_steps: int
    optimizer_steps_per_epoch: int


def epoch_lengths(cfg: DictConfig, data: Data) -> Lengths:
    """An epoch loop's: ``trainer.steps``, or an epoch's batches × ``trainer.epochs``."""
    t, per_epoch = cfg.trainer, len(data.train)
    total = int(t.steps) if t.get("steps") else per_epoch * t.epochs
    return Lengths(per_epoch, total, total, per_epoch)
