"""Process topology. A single process by default; data parallelism plugs in here."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Topology:
    rank: int = 0
    world: int = 1
    device: torch.device | None = None   # set by the launcher of a data-parallel run

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model, cfg):
        return model

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """Sum a per-process tensor over processes (identity in one process)."""
        return value

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a per-process tensor along dim 0 (identity in one process)."""
        return tensor


_current = Topology()


def current() -> Topology:
    return _current
