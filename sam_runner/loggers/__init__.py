"""Experiment loggers (``logger=<name>``). metrics.jsonl and summary.json are written whatever
the logger; a logger mirrors them somewhere else (Weights & Biases). Only rank 0 logs.

Interface: ``start()`` once the run knows whether it resumes (``load_state_dict`` restores the
``run_id`` of the run it continues, kept in the checkpoint), ``log(row)`` per metrics line,
``summary(dict)`` once at the end, ``finish(status)``.

Several at once: ``logger=[wandb,tensorboard]`` (Hydra composes both yaml files into
``logger``; each one's ``loggers.<name>: true`` says it was chosen): one ``Loggers`` that
passes every call to each, in the order given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..registry import LOGGERS

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from omegaconf import DictConfig


class NullLogger:
    """logger=none: local files only."""

    run_id = None

    def start(self) -> None:
        """Nothing to start."""
        pass

    def log(self, row: dict) -> None:
        """Nothing logged."""
        pass

    def summary(self, summary: dict) -> None:
        """Nothing logged."""
        pass

    def finish(self, status: str) -> None:
        """Nothing to finish."""
        pass

    def state_dict(self) -> dict:
        """The run id (None), for a checkpoint."""
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""
        pass


@LOGGERS.register("none", "local files only (metrics.jsonl, summary.json, plots)")
def none(_cfg: DictConfig, _run_dir: Path, _full_cfg: DictConfig) -> NullLogger:
    """No logger beyond the run folder's own files."""
    return NullLogger()


class Loggers:
    """Several loggers as one (``logger=[wandb,tensorboard]``). Its state holds each one's, by
    name, and the first ``run_id`` (W&B's) where the single-logger state keeps it."""

    def __init__(self, parts: dict) -> None:
        self.parts = parts

    @property
    def run_id(self) -> str | None:
        """The first logger's run id that has one (W&B's), or None."""
        return next((p.run_id for p in self.parts.values() if p.run_id), None)

    def start(self) -> None:
        """Start every logger."""
        for p in self.parts.values():
            p.start()

    def log(self, row: dict) -> None:
        """A metrics row to every logger."""
        for p in self.parts.values():
            p.log(row)

    def summary(self, summary: dict) -> None:
        """The run's summary to every logger."""
        for p in self.parts.values():
            p.summary(summary)

    def finish(self, status: str) -> None:
        """Finish every logger with the run's status."""
        for p in self.parts.values():
            p.finish(status)

    def state_dict(self) -> dict:
        """The run id and every logger's state, for a checkpoint."""
        return {"run_id": self.run_id, "parts": {n: p.state_dict() for n, p in self.parts.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore every logger's state (a checkpoint of one logger: its state for each)."""
        for name, p in self.parts.items():  # a checkpoint of one logger: its state for each
            p.load_state_dict((state.get("parts") or {}).get(name, state))


def chosen(cfg: DictConfig) -> list[str]:
    """The loggers ``cfg`` chooses: those of ``loggers`` set true, else ``name``."""
    marked = [str(k) for k, v in (cfg.get("loggers") or {}).items() if v]
    return [m for m in marked if m != "none"] or [str(cfg.get("name", "none"))]


def build_logger(cfg: DictConfig, run_dir: Path, full_cfg: DictConfig) -> Any:
    """The logger (or loggers) ``cfg`` chooses, not yet started."""
    names = chosen(cfg)
    if len(names) == 1:
        return LOGGERS.build(names[0], cfg, run_dir, full_cfg)
    return Loggers({n: LOGGERS.build(n, cfg, run_dir, full_cfg) for n in names})
