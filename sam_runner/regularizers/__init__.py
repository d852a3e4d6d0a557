"""Training-objective regularizers (``regularizer=<name>``): a term added to each pass's loss.

A regularizer is a run part (``sam_runner.part.Part``) whose ``loss_term`` adds its term to each
micro-batch's objective, once per pass. Each lives in a module of this package that registers
its builder, ``REGULARIZERS.register(name, description)``, taking the ``regularizer`` group and
the run's autocast context and returning the part (None when it adds nothing); the package's
modules are found by the registry, so a new regularizer is a module here and a yaml in
``conf/regularizer/``. ``none`` builds no part, so a run without a regularizer is unchanged bit
for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..part import Part
from ..registry import REGULARIZERS

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig

    from ..part import Run


@REGULARIZERS.register("none", "the training loss alone")
def none(cfg: DictConfig, autocast: AbstractContextManager | None = None) -> None:  # noqa: ARG001 (every entry's signature)
    """No regularizer: no term, no part."""
    return None  # no term, no part


def build_regularizer(
    cfg: DictConfig | None, autocast: AbstractContextManager | None = None
) -> Part | None:
    """The regularizer ``cfg`` (the ``regularizer`` group; absent: none) names, keys checked;
    None when it adds nothing."""
    if cfg is None:
        return None
    return REGULARIZERS.build(cfg.get("name", "none"), cfg, autocast)


def build_part(run: Run) -> Part | None:
    """The run's regularizer part (None when it adds nothing)."""
    return build_regularizer(run.cfg.get("regularizer"), run.loop.autocast)


def check(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """The ``regularizer`` group's keys (every check's signature)."""
    build_regularizer(cfg.get("regularizer"))
