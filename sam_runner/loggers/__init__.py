"""Experiment loggers (``logger=<name>``). metrics.jsonl and summary.json are written whatever
the logger; a logger mirrors them somewhere else (Weights & Biases). Only rank 0 logs.

Interface: ``start()`` once the run knows whether it resumes (``load_state_dict`` restores the
``run_id`` of the run it continues, kept in the checkpoint), ``log(row)`` per metrics line,
``summary(dict)`` once at the end, ``finish(status)``.
"""

from __future__ import annotations

from ..registry import LOGGERS


class NullLogger:
    """logger=none: local files only."""

    run_id = None

    def start(self) -> None:
        pass

    def log(self, row: dict) -> None:
        pass

    def summary(self, summary: dict) -> None:
        pass

    def finish(self, status: str) -> None:
        pass

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        pass


@LOGGERS.register("none", "local files only (metrics.jsonl, summary.json, plots)")
def none(_cfg, _run_dir, _full_cfg) -> NullLogger:
    return NullLogger()


def build_logger(cfg, run_dir, full_cfg):
    """The logger ``cfg.name`` names, not yet started."""
    return LOGGERS.build(cfg.get("name", "none"), cfg, run_dir, full_cfg)
