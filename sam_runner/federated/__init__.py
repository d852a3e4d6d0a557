"""Federated SAM (``federated=fedavg|fedfft|fedvssam``): simulated clients over disjoint shards
of the training set, each running the run's optimizer from the global weights, and a server that
aggregates them (docs/federated.md). ``build_federation`` gives the run its ``federated`` part
(None without one); ``rounds.FederatedLoop`` is its loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .algorithms import Centralized, check
from .rounds import build_federation

if TYPE_CHECKING:
    from omegaconf import DictConfig


def check_part(cfg: DictConfig, where: object = None) -> None:
    """The federated group's keys and what it cannot be combined with; before a run (not when
    it builds the split itself), the split the data can make (it reads the training labels)."""
    check(cfg)
    if getattr(where, "preflight", False):
        from .split import check_split

        check_split(cfg)


__all__ = ["Centralized", "build_federation", "check", "check_part"]
