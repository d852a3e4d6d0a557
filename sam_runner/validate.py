"""A composed config checked whole before anything trains: every group's names and values, with
no data loaded (but a federated run's training labels, to make its split up front) and the model
built on the meta device (no memory, no weights downloaded). The
CLI runs it on every job of a sweep before the first one starts; ``train()`` runs it too.

``warnings`` lists the settings that are legal but almost surely not meant (one line each)."""

from __future__ import annotations

import os

import torch

from . import distributed
from .adapters import attach_adapters, method
from .averaging import validate as validate_averaging
from .circuits.task import check_config as check_circuit_config
from .cli_words import PROGRESS, check_format
from .data import validate as validate_dataset
from .data.sources import data_shape
from .distill import check_teacher
from .errors import integer, number, require
from .federated.algorithms import check as check_federated
from .federated.split import check_split
from .lock import ON_LOCKED
from .loggers import build_logger
from .losses import per_example
from .metrics.robustness import validate as validate_corruptions
from .metrics.tracker import validate as validate_metrics
from .models import build_model, check_initial_weights, without_download
from .optim.build import build_optimizer
from .registry import DATASETS, SAMPLERS
from .regularizers import build_regularizer
from .schedulers import validate as validate_scheduler
from .settings import MAX_SEED, PRECISIONS, plot_format

PLACEHOLDER_STEPS = 1000  # the optimizer's schedules need a length; the data's is not read here


def validate_config(cfg, awaiting=frozenset()) -> None:
    """One-line UserErrors for anything a run would refuse on its own settings; ``awaiting``:
    keys an earlier stage's job will set (``stages.resolve``), taken as set."""
    validate_trainer(cfg, awaiting)
    validate_dataset(cfg.dataset)
    entry = SAMPLERS.entry(cfg.dataset.get("sampler", "uniform"))
    if entry.meta.get("check"):
        entry.check(cfg.dataset)
    validate_scheduler(cfg.scheduler)
    validate_metrics(cfg.metrics)
    validate_corruptions(cfg.metrics, cfg.dataset)
    build_logger(cfg.logger, ".", cfg)  # checks its keys; starts nothing
    distributed.check_devices(cfg.trainer.get("devices", 1), str(cfg.trainer.device))
    distributed.check_threads(cfg.trainer.get("threads"))
    with torch.device("meta"):
        model = build_model(without_download(cfg.model), *data_shape(cfg.dataset))
        epochs = _epochs(cfg) or PLACEHOLDER_STEPS  # perturb_from as an epoch is checked on them
        build_optimizer(cfg, model, PLACEHOLDER_STEPS * epochs, steps_per_epoch=PLACEHOLDER_STEPS)
    check_split(cfg)  # reads the training labels: last, after every check that reads nothing


def _epochs(cfg) -> int | None:
    """The run's epochs as far as its config tells (a federated run's rounds); None under a step
    budget, whose epochs depend on the data (``perturb_from`` beyond them is then refused when
    the run builds its optimizer)."""
    fed = cfg.get("federated") or {}
    if fed.get("name", "none") != "none":
        return int(fed.get("rounds", 0)) or None
    return None if cfg.trainer.get("steps") else int(cfg.trainer.epochs)


def validate_trainer(cfg, awaiting=frozenset()) -> None:
    """The trainer's own keys (the other groups check theirs where they are built)."""
    t = cfg.trainer
    integer("trainer.epochs", t.epochs, "an integer >= 1", lambda e: e >= 1)
    build_regularizer(cfg.get("regularizer"))  # its keys, before anything is written
    check_circuit_config(cfg)  # model=pc and what only a circuit takes (em, pc_* regularizers)
    check_federated(cfg)  # the federated group's keys and what it cannot be combined with
    check_teacher(cfg)  # trainer.distill: its keys and the teacher's folder
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
    validate_averaging(cfg)
    _check_init_from(cfg)
    _check_peft(cfg, awaiting)


def _check_init_from(cfg) -> None:
    """``model.init_from`` exists and fits the model, before anything is read or trained."""
    shape, classes = data_shape(cfg.dataset)
    known = DATASETS.entry(cfg.dataset.name).num_classes is not None
    check_initial_weights(without_download(cfg.model), shape, classes, known)


def _check_peft(cfg, awaiting) -> None:
    """``model.peft``'s keys and targets on the model (built on the meta device)."""
    from omegaconf import OmegaConf

    if method(cfg.model) == "none":
        return
    model_cfg = cfg.model
    if model_cfg.get("init_from") in (None, "") and "model.init_from" in awaiting:
        # an earlier stage's job, not run yet: its weights are checked when this stage starts
        model_cfg = OmegaConf.merge(model_cfg, {"init_from": "(an earlier stage's job)"})
    with torch.device("meta"):
        shape, classes = data_shape(cfg.dataset)
        attach_adapters(model_cfg, build_model(without_download(model_cfg), shape, classes), shape)


def warnings(cfg) -> list[str]:
    """Settings that are legal but almost surely not what was meant."""
    t, out = cfg.trainer, []
    device = distributed.resolve_device(str(t.device)).type
    if t.precision == "fp16" and device == "cpu":
        out.append(
            "trainer.precision=fp16 on a CPU is 4-10x slower than fp32 and gains nothing; "
            "use fp32 (or bf16)"
        )
    warmup = float(cfg.scheduler.get("warmup_epochs", 0) or 0)
    if warmup >= t.epochs and not t.get("steps"):  # a step budget: epochs unknown here
        out.append(
            f"scheduler.warmup_epochs={warmup:g} >= trainer.epochs={t.epochs}: the learning "
            "rate never leaves its warmup"
        )
    late = [m for m in cfg.scheduler.get("milestones", None) or [] if m >= t.epochs]
    if late and cfg.scheduler.name == "multistep" and not t.get("steps"):
        out.append(
            f"scheduler.milestones {', '.join(f'{m:g}' for m in late)} are at or beyond "
            f"trainer.epochs={t.epochs}: the learning rate is never multiplied by gamma there"
        )
    devices = int(t.get("devices", 1))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if device == "cpu" and devices > (cores or 1):
        out.append(
            f"trainer.devices={devices} processes share {cores} CPU core(s): each gets "
            "less than a core, and the run is slower than with fewer"
        )
    threads, (cpus, source) = t.get("threads"), distributed.allowed_cpus()
    workers = int(cfg.dataset.get("num_workers", 0) or 0)
    if cfg.dataset.name == "image_folder" and workers > max(1, cpus // devices):
        out.append(
            f"dataset.num_workers={workers} is more than the {cpus} CPU(s) allowed ({source}) "
            f"for {devices} process(es): {max(1, cpus // devices)} worker(s) a loader"
        )
    if device == "cpu" and threads is not None and threads * devices > cpus:
        out.append(
            f"trainer.threads={threads} x {devices} process(es) is more than the {cpus} CPU(s) "
            f"allowed ({source}): capped at {max(1, cpus // devices)} thread(s) per process "
            "(threads sharing cores are slower than fewer)"
        )
    return out
