"""A composed config checked whole before anything trains: every group's names and values, with
no data loaded (but a federated run's training labels, to make its split up front) and the model
built on the meta device (no memory, no weights downloaded). The CLI runs ``validate_config`` on
every job of a sweep before the first one starts; a run checks its trainer and its features
again (``validate_run``). Each feature checks its own keys (``parts.FEATURES``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import distributed
from ..data import validate as validate_dataset
from ..data.sources import data_shape
from ..loggers import build_logger
from ..models import build_model, without_download
from ..optim.build import build_optimizer, training_share
from ..schedulers import validate as validate_scheduler
from . import strategy
from .parts import Where, check_features
from .trainer_keys import validate_seed, validate_trainer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from omegaconf import DictConfig

PLACEHOLDER_STEPS = 1000  # the optimizer's schedules need a length; the data's is not read here


def validate_config(cfg: DictConfig, awaiting: Iterable[str] = frozenset()) -> None:
    """One-line UserErrors for anything a run would refuse on its own settings; ``awaiting``:
    keys an earlier stage's job will set (``stages.resolve``), taken as set."""
    for _, check in config_checks(cfg, awaiting):
        check()


def config_checks(cfg: DictConfig, awaiting: Iterable[str] = frozenset()) -> list:
    """``validate_config``'s checks in order, as (name, check) pairs, each reading only ``cfg``:
    a sweep's planner runs again only those that read a value its job changes
    (``sweep/value_checks.py``)."""

    def devices():
        distributed.check_devices(cfg.trainer.get("devices", 1), str(cfg.trainer.device))
        distributed.check_threads(cfg.trainer.get("threads"))
        strategy.check(cfg)

    def model_and_optimizer():
        with torch.device("meta"):
            model = build_model(without_download(cfg.model), *data_shape(cfg.dataset))
            epochs = _epochs(cfg) or PLACEHOLDER_STEPS  # perturb_from as an epoch: checked on them
            steps = PLACEHOLDER_STEPS * epochs
            build_optimizer(cfg, model, steps, steps_per_epoch=PLACEHOLDER_STEPS)
            training_share(cfg, 0, strategy.processes(cfg))  # a variant's process roles
            strategy.check_blocks(cfg, model)

    return [
        ("trainer", lambda: validate_trainer(cfg, seed=False)),
        ("seed", lambda: validate_seed(cfg.seed)),
        ("dataset", lambda: validate_dataset(cfg.dataset)),
        ("scheduler", lambda: validate_scheduler(cfg.scheduler)),
        ("logger", lambda: build_logger(cfg.logger, ".", cfg)),  # checks its keys; starts nothing
        ("devices", devices),
        ("model_and_optimizer", model_and_optimizer),
        # last: a check may read the training labels (a federated split), after every one that
        # reads nothing
        (
            "features",
            lambda: check_features(cfg, Where(awaiting=frozenset(awaiting), preflight=True)),
        ),
    ]


def validate_run(
    cfg: DictConfig, run_dir: Path | None = None, awaiting: Iterable[str] = frozenset()
) -> None:
    """What a run checks itself before it writes anything: its trainer and its features (no
    data read); ``awaiting``: keys an earlier stage's job will set."""
    validate_trainer(cfg)
    strategy.check(cfg, distributed.current().world)
    check_features(cfg, Where(run_dir=run_dir, awaiting=frozenset(awaiting)))


def _epochs(cfg: DictConfig) -> int | None:
    """The run's epochs as far as its config tells (a federated run's rounds); None under a step
    budget, whose epochs depend on the data (``perturb_from`` beyond them is then refused when
    the run builds its optimizer)."""
    fed = cfg.get("federated") or {}
    if fed.get("name", "none") != "none":
        return int(fed.get("rounds", 0)) or None
    return None if cfg.trainer.get("steps") else int(cfg.trainer.epochs)
