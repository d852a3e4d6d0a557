"""Federated SAM (``federated=fedavg|fedfft|fedvssam``): simulated clients over disjoint shards
of the training set, each running the run's optimizer from the global weights, and a server that
aggregates them (docs/federated.md). ``build_federation`` gives the run its ``federated`` part
(None without one); ``rounds.FederatedLoop`` is its loop."""

from __future__ import annotations

from ..registry import FEDERATED
from .algorithms import Centralized, check


def build_federation(cfg, data):
    """The run's federation (None without one), its keys checked."""
    check(cfg)
    f = cfg.get("federated")
    algorithm = FEDERATED.build("none" if f is None else f.get("name", "none"), f)
    if not algorithm.enabled:
        return None
    from .rounds import Federation

    return Federation(cfg, algorithm, data, cfg.seed)


def check_part(cfg, where=None) -> None:
    """The federated group's keys and what it cannot be combined with; before a run (not when
    it builds the split itself), the split the data can make (it reads the training labels)."""
    check(cfg)
    if getattr(where, "preflight", False):
        from .split import check_split

        check_split(cfg)


__all__ = ["Centralized", "build_federation", "check", "check_part"]
