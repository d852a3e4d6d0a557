"""A probabilistic circuit's sharpness regularizers (``regularizer=pc_trace``,
``regularizer=pc_adaptive``; ``model=pc``): the part is ``circuits.regularizers.
CircuitRegularizer`` (its gradient form and its closed-form EM pseudo-counts; docs/circuits.md)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..circuits.regularizers import CircuitRegularizer
from ..errors import number
from ..registry import REGULARIZERS

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig


def _weight(cfg) -> float:
    return number("regularizer.weight", cfg.get("weight", 0.01), "a finite number >= 0",
                  lambda w: 0 <= w < math.inf)  # fmt: skip


@REGULARIZERS.register("pc_trace", "+ weight·(−tr H) of a circuit (model=pc), H in the sum weights")
def pc_trace(
    cfg: DictConfig,
    autocast: AbstractContextManager | None = None,  # noqa: ARG001 (every entry's signature)
) -> CircuitRegularizer | None:
    """``pc_trace``: + weight·(−tr H) of the circuit, H in the sum weights (None at weight 0)."""
    weight = _weight(cfg)
    return CircuitRegularizer(weight, adaptive=False) if weight else None


@REGULARIZERS.register("pc_adaptive", "+ weight·Σ each sum node's local curvature (model=pc)")
def pc_adaptive(
    cfg: DictConfig,
    autocast: AbstractContextManager | None = None,  # noqa: ARG001 (every entry's signature)
) -> CircuitRegularizer | None:
    """``pc_adaptive``: + weight·Σ each sum node's local curvature (None at weight 0)."""
    weight = _weight(cfg)
    return CircuitRegularizer(weight, adaptive=True) if weight else None
