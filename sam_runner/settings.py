"""A run's settings as keys: override keys, the how-it-runs keys, and the settings a result depends
on.

Two runs are the same run when their settings agree on every key but the how-it-runs ones
(``RUN_ONLY_KEYS``: a resume on another device, with another logger or data folder is the
same run). The sweep rule adds ``hydra.job.config.override_dirname.exclude_keys``.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from .errors import RunFolderConflict

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from omegaconf import DictConfig

# the words a run's config accepts that commands above the trainer read too (sam-eval, sam-report,
# a sweep's objective): here, so that none of them imports the trainer for a constant
MAX_SEED = 2**32 - 1  # torch seeds are 64-bit, and runs derive further seeds from it
PRECISIONS = ("fp32", "bf16", "fp16")


def plot_format(cfg: DictConfig) -> str:
    """``plots.format``: the format of the run's figures (png without the key: a config
    composed before it existed)."""
    plots = cfg.get("plots") or {}
    return str(plots.get("format", "png"))


def objective_keys(cfg: DictConfig) -> list[str]:
    """``trainer.objective``'s keys for a composed config: one key, several (a list, for a
    search of several objectives), or none (``auto`` without a validation split)."""
    given = cfg.trainer.get("objective", "auto") or "auto"
    several = hasattr(given, "__iter__") and not isinstance(given, str)
    keys = [str(k) for k in given] if several else [str(given)]
    if keys != ["auto"]:
        return keys
    return ["val_acc"] if cfg.dataset.get("val_split") else []


def objective_key(cfg: DictConfig) -> str | None:
    """``trainer.objective``'s (first) key for a composed config, or None (``auto`` without a
    validation split)."""
    keys = objective_keys(cfg)
    return keys[0] if keys else None


RUN_ONLY_KEYS = (
    "hydra",
    "trainer.device",
    "trainer.progress",
    "trainer.progress_every_s",
    "trainer.checkpoint_every_n_steps",  # where a run can be resumed from, not what it computes
    "trainer.on_locked",
    "trainer.threads",  # how many CPU threads, not what a run computes
    "trainer.compile",
    "trainer.compile_mode",
    "trainer.activation_checkpointing",  # recomputes activations: memory, not results
    "trainer.fsdp_unit_mb",  # how many collectives carry the shards, not what they carry
    "trainer.channels_last",
    "trainer.cudnn_benchmark",  # an algorithm choice per convolution: speed, not results
    "logger",
    "dataset.data_dir",
    "dataset.download",
    "dataset.num_workers",  # each example's augmentation is seeded by its place, not its worker
    "plots",  # the figures' file format, not what a run computes
)


def override_key(override: str) -> str:
    """The key an override sets: ``+trainer.foo=1`` -> ``trainer.foo``, ``hydra/launcher=slurm`` ->
    ``hydra/launcher``, ``optimizer@x=sam`` -> ``optimizer``."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


@functools.lru_cache(maxsize=4096)  # a report asks it of every override of every job
def run_only(key: str, exclude: tuple[str, ...] = RUN_ONLY_KEYS) -> bool:
    """Whether a config key or override key (``logger.project``, ``hydra/launcher``) is a
    how-it-runs
    key."""
    key = override_key(key)
    return any(key == k or key.startswith((k + ".", k + "/")) for k in exclude)


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested dict as ``{"a.b.c": value}`` (empty sections kept as values)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def result_config(cfg: DictConfig | Mapping) -> dict:
    """What a run's results depend on: the resolved config as dotted keys, how-it-runs keys left
    out.
    """
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    return {k: v for k, v in flatten(tree).items() if not run_only(k)}


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def describe_changes(changes: list[str], limit: int = 3) -> str:
    """The first ``limit`` changes, joined, and how many more there are."""
    return ", ".join(changes[:limit]) + (
        f" and {len(changes) - limit} more" if len(changes) > limit else ""
    )


def require_same_config(saved: dict | None, now: dict, what: str, run_dir: Path | str) -> None:
    """RunFolderConflict naming the keys (old -> new) whose values differ between a stored result
    config and this run's. A run stored before configs were (``saved`` None) matches; so do keys
    only one side has: options a newer or older version added or dropped, not another run."""
    if not saved:
        return
    changes = [
        f"{k} {_show(saved[k])} -> {_show(v)}"
        for k, v in now.items()
        if k in saved and saved[k] != v
    ]
    if changes:
        raise RunFolderConflict(
            f"{what} belongs to a different run ({describe_changes(changes)}); use another run "
            f"folder, or delete {run_dir} to start over"
        )
