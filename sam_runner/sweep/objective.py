"""The number a job returns to a sweeper: ``trainer.objective``, and which way is better.

``trainer.objective`` names any key of the run's summary.json or of its final metrics line
(``val_acc``, ``val_loss``, ``test_acc``, ``lambda_max``, ...), or a list of them (a search of
several objectives, each with its own direction); ``auto`` is ``val_acc`` when
``dataset.val_split`` holds out a validation set, and no objective otherwise (a search then
refuses to start). ``trainer.objective_direction`` is ``maximize``, ``minimize`` or ``auto``:
accuracies are maximised, everything else (losses, ECE, NLL, curvature) minimised. A job that
failed or diverged, or whose objective is not a finite number, returns the worst value, so the
search goes on and never picks it.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError, require
from ..rundir import METRICS
from ..settings import objective_key, objective_keys

if TYPE_CHECKING:
    from omegaconf import DictConfig

# where a search keeps its Optuna study (in the sweep folder), and the study's name; searches
# before the journal kept it in SQLite (sweep/study.py migrates such a file)
STORAGE_FILE, STUDY_NAME = "optuna.journal", "search"
OLD_STORAGE_FILE = "optuna.db"

DIRECTIONS = ("auto", "maximize", "minimize")


def direction(cfg: DictConfig, key: str | None = None) -> str:
    """``maximize`` or ``minimize`` for the config's objective (or for ``key``, one of its
    several): ``trainer.objective_direction`` when it names one, else by the key's name."""
    way = str(cfg.trainer.get("objective_direction", "auto"))
    if way != "auto" and key is None:
        return way
    key = key or objective_key(cfg) or "val_acc"
    return "maximize" if key.endswith("acc") or "_acc_" in key else "minimize"


def validate(cfg: DictConfig) -> None:
    """``trainer.objective`` and ``trainer.objective_direction``: known directions, one per
    objective key."""
    way = cfg.trainer.get("objective_direction", "auto")
    require(
        way in DIRECTIONS,
        f"trainer.objective_direction={way!r} is unknown; choose auto, maximize or minimize",
    )
    given = cfg.trainer.get("objective", "auto")
    keys = [given] if isinstance(given, str) or given is None else list(given)
    require(
        bool(keys) and all(isinstance(k, str) and k.strip() != "" for k in keys),
        f"trainer.objective={given!r} must be a key of summary.json or of the final metrics line "
        "(val_acc, val_loss, test_acc, ...), a list of such keys, or auto",
    )
    split = cfg.dataset.get("val_split")
    key = next((k for k in keys if k.startswith("val_")), None)
    require(
        key is None or bool(split),
        f"trainer.objective={key} is measured on a validation split, and dataset.val_split="
        f"{split}: set dataset.val_split (e.g. dataset.val_split=0.1), or name another key "
        "(test_acc, ...)",
    )


def require_for_search(cfg: DictConfig) -> None:
    """A search needs an objective, and one measured on held-out training data unless the user
    names a test metric explicitly."""
    keys = objective_keys(cfg)
    held_out = bool(cfg.dataset.get("val_split"))
    require(
        bool(keys) and (held_out or not any(k.startswith("val_") for k in keys)),
        f"a search needs a validation split to select on, and dataset.val_split="
        f"{cfg.dataset.get('val_split')}: set dataset.val_split (e.g. dataset.val_split=0.1), or "
        "name a test metric explicitly with trainer.objective=test_acc (the summary then marks "
        "the selection as made on test data)",
    )


# the keys every run logs (its evaluation lines and summary.json), and those some settings add
ALWAYS_LOGGED = ("test_acc", "test_loss", "test_ece", "test_nll", "train_acc", "train_loss")
ALWAYS_LOGGED += ("lr", "epoch", "epochs", "step", "time_s", "train_time_s", "grad_evals_per_step")
VAL_LOGGED = ("val_acc", "val_loss", "val_ece", "val_nll", "best_val_acc", "best_val_epoch")
HESSIAN_LOGGED = ("lambda_max",)


def logged_keys(cfg: DictConfig) -> list[str]:
    """The keys a run of this config is known to log: every run's, the validation split's
    with ``dataset.val_split``, λ_max with ``metrics.hessian.enabled``, and the top
    eigenvalues with ``metrics.hessian.k``."""
    keys = list(ALWAYS_LOGGED)
    if cfg.dataset.get("val_split"):
        keys += VAL_LOGGED
    hessian = (cfg.get("metrics") or {}).get("hessian") or {}
    if hessian.get("enabled"):
        keys += [*HESSIAN_LOGGED, *(f"lambda_{i}" for i in range(2, int(hessian.get("k", 1)) + 1))]
    return keys


# keys that parts of a run add to its lines or its summary (variants, weight decay, samplers,
# federation, distillation, curvature tracking, corruptions, measures): a name, or a family of
# names by its start (``test_acc_c_fog``, ``avg_test_acc``, ``lambda_3``, ``hessian_trace``)
PART_KEYS = ("rho", "sigma", "oui", "round", "rounds", "clients", "label_skew", "epoch", "time_s")
PART_KEYS += ("grad_evals", "perturbed_fraction", "teacher_forwards_per_step", "step_loss")
PART_KEYS += ("sps_step", "tau_bar", "sgs_weight_ratio", "parameters", "trainable_parameters")
PART_KEYS += ("corpus_bytes", "mce", "pruned_value", "flip_prob", "dist_from_init")
PART_KEYS += ("clients_sampled",)
PART_FAMILIES = ("test_", "val_", "train_", "avg_", "lambda_max_", "hessian_", "eos_", "grad_")
PART_FAMILIES += ("armijo_", "sharpness_", "fisher_", "quant_", "sample_", "precond_", "param_")
PART_FAMILIES += ("path_", "spectral_", "input_", "best_", "eps_")
TOP_K = re.compile(r"lambda_\d+")  # metrics.hessian.k's eigenvalues past the first


def may_be_logged(key: str) -> bool:
    """Whether some setting's run logs ``key`` (a part's key, or one of a part's families)."""
    return key in PART_KEYS or key.startswith(PART_FAMILIES) or bool(TOP_K.fullmatch(key))


def misspelt_from(key: str, known: list[str]) -> list[str]:
    """The logged keys ``key`` spells longer without a part's ``_`` suffix (``val_accuracy``
    for ``val_acc``); ``test_acc_few`` and ``test_mce`` are parts' keys, not typos."""
    return [k for k in known if key.startswith(k) and key != k and key[len(k)] != "_"]


def require_logged(cfg: DictConfig) -> None:
    """UserError naming an objective key this run does not log (checked before anything runs):
    a key the settings switch off (``val_acc`` without a validation split, ``lambda_max``
    without the Hessian), one a letter or two off a logged key (a typo), or one no run logs
    (``no_such_key``). A key some part adds (``may_be_logged``) is accepted: the job then says
    at its end if its key is not there."""
    known = logged_keys(cfg)
    switched_off = (*VAL_LOGGED, *HESSIAN_LOGGED, "lambda_2", "lambda_3")
    for key in objective_keys(cfg):
        if key in known:
            continue
        # a part's keys are many (test_acc_few, hessian_time_s, ...): a near one is not a typo,
        # but one that spells a logged key longer is (val_accuracy)
        near = difflib.get_close_matches(key, known, n=1)
        if key in PART_KEYS or TOP_K.fullmatch(key):
            near = []
        elif may_be_logged(key):
            near = misspelt_from(key, known)
        if key in switched_off or near:
            hint = f" (did you mean {near[0]}?)" if near and key not in switched_off else ""
            why = ""
            if key in VAL_LOGGED:
                why = " without dataset.val_split"
            elif key in switched_off and key.startswith("lambda_"):
                why = " with these metrics.hessian settings"
            raise UserError(
                f"trainer.objective={key} is never logged by this run{why}{hint}; it logs "
                f"{', '.join(known)}"
            )
        if not may_be_logged(key):
            raise UserError(
                f"trainer.objective={key} is not a key any run logs; this run logs "
                f"{', '.join(known)}"
            )


def worst(way: str) -> float:
    """The worst value in direction ``way`` (−∞ when maximizing, +∞ when minimizing)."""
    return -math.inf if way == "maximize" else math.inf


def final_line(run_dir: Path | str) -> dict:
    """The run's last evaluated metrics line (the one with test_acc), or {}."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((r for r in reversed(rows) if "test_acc" in r), {})


def job_value(cfg: DictConfig, run_dir: Path | str, summary: dict) -> float | list[float] | None:
    """What a job returns to the sweeper: its objective (a list of them for several), the
    worst value when it failed or diverged, the value it stopped at when the search pruned
    it; None when the config has no objective. UserError when a completed run has no such key
    (a misspelt objective would otherwise rank every trial last)."""
    keys = objective_keys(cfg)
    if not keys:
        return None
    values = [key_value(cfg, run_dir, summary or {}, k, len(keys) > 1) for k in keys]
    return values[0] if len(values) == 1 else values


def key_value(
    cfg: DictConfig, run_dir: Path | str, summary: dict, key: str, several: bool
) -> float:
    """``outcome_value`` of ``key`` in its direction (that key's own when there are ``several``)."""
    return outcome_value(run_dir, summary, key, direction(cfg, key if several else None))


def outcome_value(run_dir: Path | str, summary: dict, key: str, way: str) -> float:
    """The value of ``key`` a job of this summary returns (``way``: its direction), as
    ``job_value`` has it; also what a rebuilt study takes from a trial folder."""
    status = summary.get("status")
    if status == "pruned" and _is_number(summary.get("pruned_value")):
        return float(summary["pruned_value"])
    if status != "completed":
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
