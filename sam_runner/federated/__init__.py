"""Federated SAM (``federated=fedavg|fedfft|fedvssam``): simulated clients over disjoint shards
of the training set, each running the run's optimizer from the global weights, and a server that
aggregates them (docs/federated.md). ``build_federation`` gives the run its ``federation`` part;
``rounds.run_rounds`` is its loop."""

from __future__ import annotations

from ..registry import FEDERATED
from .algorithms import Centralized, check


def build_federation(cfg, data):
    """The run's federation (``Centralized``, disabled, without one), its keys checked."""
    check(cfg)
    f = cfg.get("federated")
    algorithm = FEDERATED.build("none" if f is None else f.get("name", "none"), f)
    if not algorithm.enabled:
        return algorithm
    from .rounds import Federation

    return Federation(cfg, algorithm, data, cfg.seed)


__all__ = ["Centralized", "build_federation", "check"]
