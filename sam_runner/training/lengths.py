"""What a run reads of its config once, before it trains: its length and its precision."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

# the autocast type of each of settings.PRECISIONS
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_for(device, precision: str):
    dtype = DTYPES[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


class Lengths(NamedTuple):
    """A run's length: scheduler steps (an epoch's, the run's) and optimizer steps (the run's,
    an epoch's)."""

    steps_per_epoch: int
    total_steps: int
    optimizer_steps: int
    optimizer_steps_per_epoch: int
