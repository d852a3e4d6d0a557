"""A run folder, loaded for measuring: its config, its model at the checkpoint's weights, its data.

The config is the job's own ``.hydra/config.yaml`` (Hydra writes it when a job starts). A run
trained by ``train(cfg, dir)`` without Hydra has none; then the settings its checkpoint records
are used (every key a result depends on), with the current environment's how-it-runs keys.
A ``dataset.data_dir`` that does not exist here (a run copied from another machine) is replaced
by the current environment's default. The model and the data are rebuilt by the runner's own
``build_data`` and ``build_model``, and the weights are read with ``Checkpoint.load`` (weights
only, never code).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from ..data import Data, build_data
from ..errors import UserError, require
from ..models import build_model
from ..paths import config_dir
from ..registry import VARIANTS
from ..runfiles import CHECKPOINT, Checkpoint
from ..train import PRECISIONS


@dataclass
class LoadedRun:
    path: Path
    cfg: object  # the job's config (OmegaConf)
    state: dict  # the checkpoint's model state dict, on the CPU
    model: nn.Module  # on the device, in eval mode, at the checkpoint's weights
    data: Data
    device: torch.device

    def criterion(self):
        """The run's own per-sample loss (its label smoothing included), as its test evaluation."""
        smoothing = float(self.cfg.trainer.get("label_smoothing", 0.0))
        return nn.CrossEntropyLoss(label_smoothing=smoothing, reduction="none")

    def autocast(self):
        dtype = PRECISIONS.get(str(self.cfg.trainer.get("precision", "fp32")))
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def train_subset(self, n: int, offset: int = 0):
        """The curvature subset of the run (``data.train_subset(n, seed)``) with ``offset`` 0."""
        return self.data.train_subset(int(n), int(self.cfg.seed) + offset)

    @property
    def variant(self) -> str:
        return str(self.cfg.optimizer.name)

    @property
    def rho(self) -> float | None:
        has_rho = VARIANTS.entry(self.variant).has_rho if self.variant in VARIANTS else True
        rho = self.cfg.optimizer.get("rho")
        return float(rho) if has_rho and rho is not None else None

    def label(self) -> str:
        """``name (sam, ρ=0.05, seed 0)`` for titles; a sweep's job (``3``) as ``sweep/3``."""
        rho = f", ρ={self.rho:g}" if self.rho is not None else ""
        name = self.path.name
        if name.isdigit():
            name = f"{self.path.parent.name}/{name}"
        return f"{name} ({self.variant}{rho}, seed {self.cfg.seed})"

    def describe(self) -> dict:
        return {
            "run": str(self.path),
            "variant": self.variant,
            "rho": self.rho,
            "seed": int(self.cfg.seed),
            "model": str(self.cfg.model.arch),
            "dataset": str(self.cfg.dataset.name),
        }


def load_run(run_dir, device) -> LoadedRun:
    """The run in ``run_dir`` at its checkpoint's weights; one-line errors for a folder that is
    not one."""
    run_dir = Path(run_dir)
    require(
        run_dir.is_dir(),
        f"run folder {str(run_dir)!r} does not exist or is not a folder; pass a folder sam-run "
        "wrote",
    )
    require(
        (run_dir / CHECKPOINT).is_file(),
        f"run folder {run_dir} has no checkpoint ({CHECKPOINT}); sam-landscape needs the weights "
        "a sam-run run saves at each evaluated epoch",
    )
    saved = Checkpoint(run_dir / CHECKPOINT).load()
    cfg = run_config(run_dir, saved)
    torch.manual_seed(int(cfg.seed))  # as the run built its data
    data = build_data(cfg.dataset, device, int(cfg.seed))
    require(
        data.train_tensors is not None,
        f"dataset={cfg.dataset.name} (run {run_dir}) is read from folders in batches; "
        "sam-landscape needs an in-memory dataset (mnist1d, digits, cifar10, cifar100)",
    )
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    try:
        model.load_state_dict(saved["model"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserError(
            f"checkpoint {run_dir / CHECKPOINT} does not fit the model its config builds "
            f"({type(e).__name__}); was the config changed after training?"
        ) from None
    model.to(device).eval()
    return LoadedRun(run_dir.resolve(), cfg, saved["model"], model, data, device)


def run_config(run_dir: Path, saved: dict):
    """The job's config: ``.hydra/config.yaml``, else the settings its checkpoint records."""
    path = run_dir / ".hydra" / "config.yaml"
    if path.is_file():
        try:
            cfg = OmegaConf.load(path)
        except Exception as e:
            raise UserError(f"{path} is unreadable ({type(e).__name__}); restore it") from None
    else:
        flat = (saved.get("fingerprint") or {}).get("config")
        require(
            isinstance(flat, dict) and bool(flat),
            f"run folder {run_dir} has no .hydra/config.yaml and its checkpoint records no "
            "settings; sam-landscape cannot rebuild its model",
        )
        cfg = OmegaConf.create(unflatten(flat))
    _data_dir_here(cfg)
    return cfg


def unflatten(flat: dict) -> dict:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (the inverse of settings.flatten)."""
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _data_dir_here(cfg) -> None:
    """dataset.data_dir (and download) of this environment where the run's is absent or gone."""
    default = OmegaConf.load(Path(config_dir()) / "common" / "dataset.yaml")
    try:
        here = Path(str(cfg.dataset.data_dir)).is_dir()
    except Exception:  # absent, or an interpolation this environment cannot resolve
        here = False
    if not here:
        cfg.dataset.data_dir = default.data_dir
    if cfg.dataset.get("download") is None:
        cfg.dataset.download = default.download
