"""The number a job returns to a sweeper: ``trainer.objective``, and which way is better.

``trainer.objective`` names any key of the run's summary.json or of its final metrics line
(``val_acc``, ``val_loss``, ``test_acc``, ``lambda_max``, ...); ``auto`` is ``val_acc`` when
``dataset.val_split`` holds out a validation set, and no objective otherwise (a search then
refuses to start). ``trainer.objective_direction`` is ``maximize``, ``minimize`` or ``auto``:
accuracies are maximised, everything else (losses, ECE, NLL, curvature) minimised. A job that
failed or diverged, or whose objective is not a finite number, returns the worst value, so the
search goes on and never picks it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import UserError, require
from ..rundir import METRICS
from ..settings import objective_key

# where a search keeps its Optuna study (in the sweep folder), and the study's name; searches
# before the journal kept it in SQLite (sweep/study.py migrates such a file)
STORAGE_FILE, STUDY_NAME = "optuna.journal", "search"
OLD_STORAGE_FILE = "optuna.db"

DIRECTIONS = ("auto", "maximize", "minimize")


def direction(cfg) -> str:
    """``maximize`` or ``minimize`` for the config's objective."""
    way = str(cfg.trainer.get("objective_direction", "auto"))
    if way != "auto":
        return way
    key = objective_key(cfg) or "val_acc"
    return "maximize" if key.endswith("acc") or "_acc_" in key else "minimize"


def validate(cfg) -> None:
    way = cfg.trainer.get("objective_direction", "auto")
    require(
        way in DIRECTIONS,
        f"trainer.objective_direction={way!r} is unknown; choose auto, maximize or minimize",
    )
    key = cfg.trainer.get("objective", "auto")
    require(
        isinstance(key, str) and key.strip() != "",
        f"trainer.objective={key!r} must be a key of summary.json or of the final metrics line "
        "(val_acc, val_loss, test_acc, ...) or auto",
    )
    split = cfg.dataset.get("val_split")
    require(
        not key.startswith("val_") or bool(split),
        f"trainer.objective={key} is measured on a validation split, and dataset.val_split="
        f"{split}: set dataset.val_split (e.g. dataset.val_split=0.1), or name another key "
        "(test_acc, ...)",
    )


def require_for_search(cfg) -> None:
    """A search needs an objective, and one measured on held-out training data unless the user
    names a test metric explicitly."""
    key = objective_key(cfg)
    require(
        key is not None and (not key.startswith("val_") or bool(cfg.dataset.get("val_split"))),
        f"a search needs a validation split to select on, and dataset.val_split="
        f"{cfg.dataset.get('val_split')}: set dataset.val_split (e.g. dataset.val_split=0.1), or "
        "name a test metric explicitly with trainer.objective=test_acc (the summary then marks "
        "the selection as made on test data)",
    )


def worst(way: str) -> float:
    return -math.inf if way == "maximize" else math.inf


def final_line(run_dir) -> dict:
    """The run's last evaluated metrics line (the one with test_acc), or {}."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((r for r in reversed(rows) if "test_acc" in r), {})


def job_value(cfg, run_dir, summary: dict) -> float | None:
    """What a job returns to the sweeper: its objective (the worst value when it failed or
    diverged), or None when the config has no objective. UserError when a completed run has no
    such key (a misspelt objective would otherwise rank every trial last)."""
    key = objective_key(cfg)
    if key is None:
        return None
    way = direction(cfg)
    if (summary or {}).get("status") != "completed":
        return worst(way)
    value = summary.get(key)
    if value is None:
        line = final_line(run_dir)
        if key not in line:
            known = sorted(k for k, v in {**line, **summary}.items() if _is_number(v))
            raise UserError(
                f"trainer.objective={key} is not a key of summary.json or of the final metrics "
                f"line of {run_dir}; choose one of {', '.join(known)}"
            )
        value = line[key]
    return float(value) if _is_number(value) and math.isfinite(value) else worst(way)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
