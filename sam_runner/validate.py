"""A composed config checked whole before anything trains: every group's names and values, with
no data loaded and the model built on the meta device (no memory, no weights downloaded). The
CLI runs it on every job of a sweep before the first one starts; ``train()`` runs it too.

``warnings`` lists the settings that are legal but almost surely not meant (one line each)."""

from __future__ import annotations

import os

import torch

from . import distributed
from .data import validate as validate_dataset
from .loggers import build_logger
from .metrics.robustness import validate as validate_corruptions
from .metrics.tracker import validate as validate_metrics
from .models import build_model
from .optim.build import build_optimizer
from .registry import DATASETS, SAMPLERS
from .schedulers import validate as validate_scheduler

PLACEHOLDER_STEPS = 1000  # the optimizer's schedules need a length; the data's is not read here


def validate_config(cfg) -> None:
    """One-line UserErrors for anything a run would refuse on its own settings."""
    from .train import validate as validate_trainer

    validate_trainer(cfg)
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
        model = build_model(without_download(cfg.model), *_data_shape(cfg.dataset))
        build_optimizer(cfg, model, PLACEHOLDER_STEPS)


def _data_shape(dataset_cfg) -> tuple[tuple, int]:
    """(input shape, class count) of a dataset, from its registration (image folders: their
    configured image size, and a placeholder class count)."""
    entry = DATASETS.entry(dataset_cfg.name)
    shape = entry.input_shape
    if shape is None:  # checked here too: the trainer's checks build the model first
        from .data.sources import image_size

        size = image_size(dataset_cfg)
        shape = (3, size, size)
    return tuple(shape), entry.num_classes or 2


def without_download(model_cfg):
    """The model's config with pretrained weights off: validation builds the architecture only (and
    sam-eval, which loads the run's own weights)."""
    if not model_cfg.get("pretrained", False):
        return model_cfg
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(model_cfg, resolve=True)
    out["pretrained"] = False
    return OmegaConf.create(out)


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
            f"allowed ({source}): threads share cores, which is slower than fewer"
        )
    return out
