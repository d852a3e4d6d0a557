"""A composed config checked whole before anything trains: every group's names and values, with
no data loaded (but a federated run's training labels, to make its split up front) and the model
built on the meta device (no memory, no weights downloaded). The CLI runs ``validate_config`` on
every job of a sweep before the first one starts; a run checks its trainer and its features
again (``validate_run``). Each feature checks its own keys (``parts.FEATURES``)."""

from __future__ import annotations

from pathlib import Path

import torch

from .. import distributed
from ..cli_words import PROGRESS, check_format
from ..data import validate as validate_dataset
from ..data.sources import data_shape
from ..errors import integer, number, require
from ..lock import ON_LOCKED
from ..loggers import build_logger
from ..losses import per_example
from ..models import build_model, without_download
from ..optim.build import build_optimizer
from ..schedulers import validate as validate_scheduler
from ..settings import MAX_SEED, PRECISIONS, plot_format
from .parts import Where, check_features

PLACEHOLDER_STEPS = 1000  # the optimizer's schedules need a length; the data's is not read here


def validate_config(cfg, awaiting=frozenset()) -> None:
    """One-line UserErrors for anything a run would refuse on its own settings; ``awaiting``:
    keys an earlier stage's job will set (``stages.resolve``), taken as set."""
    validate_trainer(cfg)
    validate_dataset(cfg.dataset)
    validate_scheduler(cfg.scheduler)
    build_logger(cfg.logger, ".", cfg)  # checks its keys; starts nothing
    distributed.check_devices(cfg.trainer.get("devices", 1), str(cfg.trainer.device))
    distributed.check_threads(cfg.trainer.get("threads"))
    with torch.device("meta"):
        model = build_model(without_download(cfg.model), *data_shape(cfg.dataset))
        epochs = _epochs(cfg) or PLACEHOLDER_STEPS  # perturb_from as an epoch is checked on them
        build_optimizer(cfg, model, PLACEHOLDER_STEPS * epochs, steps_per_epoch=PLACEHOLDER_STEPS)
    # last: a check may read the training labels (a federated split), after every one that reads
    # nothing
    check_features(cfg, Where(awaiting=frozenset(awaiting), preflight=True))


def validate_run(cfg, run_dir: Path | None = None) -> None:
    """What a run checks itself before it writes anything: its trainer and its features."""
    validate_trainer(cfg)
    check_features(cfg, Where(run_dir=run_dir))


def _epochs(cfg) -> int | None:
    """The run's epochs as far as its config tells (a federated run's rounds); None under a step
    budget, whose epochs depend on the data (``perturb_from`` beyond them is then refused when
    the run builds its optimizer)."""
    fed = cfg.get("federated") or {}
    if fed.get("name", "none") != "none":
        return int(fed.get("rounds", 0)) or None
    return None if cfg.trainer.get("steps") else int(cfg.trainer.epochs)


def validate_trainer(cfg) -> None:
    """The trainer's own keys (the other groups check theirs where they are built)."""
    t = cfg.trainer
    integer("trainer.epochs", t.epochs, "an integer >= 1", lambda e: e >= 1)
    require(
        t.precision in PRECISIONS,
        f"trainer.precision={t.precision!r} is unknown; choose fp32, bf16 or fp16",
    )
    integer("trainer.accumulate", t.accumulate, "an integer >= 1", lambda a: a >= 1)
    for key, accepted in (("progress", PROGRESS), ("on_locked", ON_LOCKED)):
        value = t.get(key, accepted[0])
        require(
            value in accepted, f"trainer.{key}={value!r} is unknown; choose {', '.join(accepted)}"
        )
    check_format(plot_format(cfg))
    bs = cfg.dataset.batch_size
    require(
        not isinstance(bs, int) or bs <= 0 or bs % t.accumulate == 0,
        f"dataset.batch_size={bs} must be divisible by trainer.accumulate={t.accumulate}",
    )
    clip = t.get("gradient_clip")
    require(
        clip is None or (isinstance(clip, (int, float)) and clip > 0),
        f"trainer.gradient_clip={clip} must be null or a number > 0",
    )
    number(
        "trainer.label_smoothing",
        t.get("label_smoothing", 0.0),
        "a number in [0, 1]",
        lambda s: 0 <= s <= 1,
    )
    integer(
        "trainer.eval_every_n_epochs",
        t.get("eval_every_n_epochs", 1),
        "an integer >= 1",
        lambda n: n >= 1,
    )
    # torch seeds are 64-bit, and runs derive further seeds from it (seed * 100003 + epoch)
    integer("seed", cfg.seed, f"an integer in [0, {MAX_SEED}]", lambda s: 0 <= s <= MAX_SEED)
    for key in ("steps", "eval_every_n_steps"):  # null: off
        if t.get(key) is not None:
            integer(f"trainer.{key}", t[key], "an integer >= 1 (or null)", lambda n: n >= 1)
    per_example(t.get("loss", "cross_entropy"), float(t.get("label_smoothing", 0.0)))
