"""Settings that are legal but almost surely not what was meant (one line each)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from .. import distributed

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..clock import Clock


def say_if_every_epoch_is_evaluated(every_n_steps: int, steps_per_epoch: int, clock: Clock) -> None:
    """``trainer.eval_every_n_steps`` at most an epoch's steps: evaluations are made at epoch
    ends, so every epoch is evaluated, as without it (one line)."""
    if every_n_steps and every_n_steps <= steps_per_epoch and clock.epochs > 1:
        print(
            f"sam-run: warning: trainer.eval_every_n_steps={every_n_steps} is at most the "
            f"{steps_per_epoch} steps of an epoch, and a run evaluates at epoch ends: every "
            "epoch is evaluated, as without it",
            file=sys.stderr,
            flush=True,
        )


def warnings(cfg: DictConfig) -> list[str]:
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
