"""Experiment loggers. metrics.jsonl and summary.json are written whatever the logger;
a logger mirrors them somewhere else (Weights & Biases). Only rank 0 logs.

Interface: ``run_id`` (saved in the checkpoint, so a resumed job continues the same
run), ``log(row)`` per metrics line, ``summary(dict)`` once at the end, ``finish(status)``.
"""
from __future__ import annotations

from ..errors import require
from . import wandb as _wandb  # imports W&B itself only when logger=wandb is built


class NullLogger:
    """logger=none: local files only."""

    run_id = None

    def log(self, row: dict) -> None:
        pass

    def summary(self, summary: dict) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


def _null(cfg, run_dir, full_cfg, run_id):
    return NullLogger()


LOGGERS = {"none": _null, "wandb": _wandb.build}


def build_logger(cfg, run_dir, full_cfg, run_id=None):
    name = cfg.get("name", "none")
    require(name in LOGGERS, f"logger={name!r} is unknown; choose one of {', '.join(LOGGERS)}")
    return LOGGERS[name](cfg, run_dir, full_cfg, run_id)
