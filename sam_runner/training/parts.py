"""The run's list of parts: every training-time feature, in the order its hooks run.

Written once, here: a disabled feature builds to nothing and is absent. The order is what a
step needs: the distillation objective before a regularizer adds to it; MixUp before any pass
sees the batch; the sampler, the curvature tracker, robustness, averaging, weight decay and the
federation's keys in a metrics line in that order. ``early`` parts are built right after the
model, before the optimizer sees its parameters (given weights, adapters, per-layer decay
groups, the federation's loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import averaging, distill, federated, regularizers, samplers, weight_decay
from ..adapters import part as adapters
from ..data import augment
from ..federated import rounds
from ..metrics import robustness, tracker
from ..models import hf
from ..optim import build as optim_build
from ..part import Part, PartBuilder, PartCheck
from . import density, pruning


@dataclass(frozen=True)
class Feature:
    """One entry of the list.

    Attributes:
        name: what the feature is (for messages).
        build: its part from the run, or None when it is off.
        check: its keys checked before anything is built or written (None: nothing to check).
        early: built right after the model, before the optimizer.
    """

    name: str
    build: PartBuilder
    check: PartCheck | None = None
    early: bool = False


@dataclass(frozen=True)
class Where:
    """What a feature's check may need beside the config.

    Attributes:
        run_dir: the run's folder (None before a run: a sweep's preflight).
        awaiting: keys an earlier stage's job will set, taken as set.
        preflight: before any job runs (checks that read data belong there, not in a run).
    """

    run_dir: Path | None = None
    awaiting: frozenset = frozenset()
    preflight: bool = False


FEATURES: tuple[Feature, ...] = (
    Feature("model=pc (density estimation)", density.build_part, density.check, early=True),
    Feature("model=hf", hf.build_part, hf.check, early=True),
    Feature("model.init_from", adapters.build_pretrained, adapters.check_pretrained, early=True),
    Feature("model.peft", adapters.build_part, adapters.check, early=True),
    Feature("trainer.distill", distill.build_part, distill.check),
    Feature("regularizer", regularizers.build_part, regularizers.check),
    Feature("dataset.mixup_alpha/cutmix_alpha", augment.build_part),
    Feature("dataset.sampler", samplers.build_part, samplers.check),
    Feature("metrics (curvature)", tracker.build_part, tracker.check),
    Feature("metrics.corruptions", robustness.build_part, robustness.check),
    Feature("trainer.weight_averaging", averaging.build_part, averaging.check),
    Feature("weight_decay", weight_decay.build_part, weight_decay.check, early=True),
    Feature("federated", rounds.build_part, federated.check_part, early=True),
    Feature("search trial", pruning.build_part),
    Feature("optimizer (training-set facts)", optim_build.build_part),
)


def build_parts(run, early: bool) -> dict[int, Part]:
    """The parts of one phase, by their place in ``FEATURES``."""
    built = {i: f.build(run) for i, f in enumerate(FEATURES) if f.early == early}
    return {i: p for i, p in built.items() if p is not None}


def check_features(cfg, where: Where) -> None:
    """Every feature's check, in the list's order."""
    for feature in FEATURES:
        if feature.check is not None:
            feature.check(cfg, where)
