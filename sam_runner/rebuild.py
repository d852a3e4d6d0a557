"""A run rebuilt from its folder: the model by the runner's own ``build_data`` and
``build_model`` at the final weights (``rundir.CHECKPOINT``) or the averaged ones
(``rundir.AVERAGED``, written by ``trainer.weight_averaging``), read weights-only, with its data.
sam-eval and sam-landscape measure a ``LoadedRun``; the run folder's files themselves are read
through ``rundir.RunDir``. Importing this module imports no torch; ``load`` does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError, require
from .rundir import CACHE, CHECKPOINT, RunDir, has_rho, run_label
from .rundir import model_state as state_dict

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


def load(
    run: RunDir,
    device: torch.device,
    weights: str = "last",
    purpose: str = "sam-landscape",
    strict: bool = False,
) -> LoadedRun:
    """The run at its final (or averaged) weights, with its data; ``strict``: the
    checkpoint's recorded settings must be the config's (sam-eval)."""
    from .adapters import attach_adapters
    from .data import build_data
    from .models import build_model, without_download
    from .settings import require_same_config, result_config

    require(
        run.path.is_dir(),
        f"run folder {str(run.path)!r} does not exist or is not a folder; pass a folder "
        "sam-run wrote",
    )
    require(
        (run.path / CHECKPOINT).is_file(),
        f"run folder {run.path} has no checkpoint ({CHECKPOINT}); {purpose} needs the "
        "weights a sam-run run saves at each evaluated epoch",
    )
    import torch

    state = state_dict(run, weights)
    say_unfinished(run, purpose)
    cfg = run.omega_config(purpose)
    if strict:
        saved = (run.checkpoint().get("fingerprint") or {}).get("config")
        require_same_config(saved, result_config(cfg), f"checkpoint {CHECKPOINT}", run.path)
    torch.manual_seed(int(cfg.seed))  # as the run built its data
    data = build_data(cfg.dataset, device, int(cfg.seed))
    # an image folder's measurement subset as training decoded it (read, never written)
    data.cache_dir, data.cache_write = run.path / CACHE, False
    torch.manual_seed(int(cfg.seed))
    model = build_model(without_download(cfg.model), data.input_shape, data.num_classes)
    attach_adapters(cfg.model, model)  # a PEFT run's checkpoint holds its adapters too
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserError(
            f"checkpoint {run.path / CHECKPOINT} does not fit the model its config builds "
            f"({type(e).__name__}); was the config changed after training?"
        ) from None
    model.to(device).eval()
    return LoadedRun(run.path.resolve(), cfg, state, model, data, device, weights)


def say_unfinished(run: RunDir, purpose: str) -> None:
    """A run that did not complete (killed, failed, running) is measured at the checkpoint it
    left: one line says so, with that checkpoint's epoch, rather than draw it without a word."""
    import sys

    if run.status == "completed":
        return
    clock = run.checkpoint().get("clock") or {}
    why = run.missing_reason if run.status == "missing" else f"it {run.status}"
    print(
        f"{purpose}: note: {run.path} did not complete ({why}); its checkpoint of epoch "
        f"{clock.get('epoch', '?')} (step {clock.get('step', '?')}) is used",
        file=sys.stderr,
    )


@dataclass
class LoadedRun:
    """What ``load`` returns: a run's config, weights, model and data."""

    path: Path
    cfg: object  # the job's config (OmegaConf)
    state: dict  # the model state dict loaded, on the CPU
    model: object  # nn.Module on the device, in eval mode, at those weights
    data: object  # sam_runner.data.Data
    device: object  # torch.device
    weights: str = "last"  # last | averaged

    def criterion(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The run's own per-sample loss (its label smoothing included), as its test evaluation
        (a sequence model's: per window, losses.per_sequence)."""
        from .losses import per_example

        smoothing = float(self.cfg.trainer.get("label_smoothing", 0.0))
        return per_example("cross_entropy", smoothing)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The run's ``trainer.precision`` autocast on its device (none for fp32)."""
        from .training.lengths import autocast_for

        return autocast_for(self.device, str(self.cfg.trainer.get("precision", "fp32")))

    def train_subset(self, n: int, offset: int = 0, keep: bool = False):
        """The curvature subset of the run (``data.train_subset(n, seed)``) with ``offset`` 0;
        ``keep``: an image folder's subset decoded here is kept in the run's cache (the
        landscape's; sam-eval only reads the cache)."""
        return self.data.train_subset(int(n), int(self.cfg.seed) + offset, write=keep or None)

    @property
    def variant(self) -> str:
        """``optimizer.name``."""
        return str(self.cfg.optimizer.name)

    @property
    def rho(self) -> float | None:
        """``optimizer.rho``, or None for a variant without one."""
        rho = self.cfg.optimizer.get("rho")
        return float(rho) if has_rho(self.variant) and rho is not None else None

    def label(self) -> str:
        """``sam, ρ = 0.05, seed 0`` for titles (``run_label``)."""
        return run_label(self.describe())

    def describe(self) -> dict:
        """The run, variant, ρ, seed, model and dataset (and the weights, when averaged)."""
        from .provenance import built_model

        out = {
            "run": str(self.path),
            "variant": self.variant,
            "rho": self.rho,
            "seed": int(self.cfg.seed),
            "model": built_model(self.cfg.model, self.data.input_shape),  # auto resolved
            "dataset": str(self.cfg.dataset.name),
        }
        if self.weights != "last":
            out["weights"] = self.weights
        return out


def load_run(
    run_dir: Path | str,
    device: torch.device,
    weights: str = "last",
    purpose: str = "sam-landscape",
    strict: bool = False,
) -> LoadedRun:
    """``load(RunDir(run_dir), ...)``: the run at its checkpoint's weights."""
    return load(RunDir(run_dir), device, weights, purpose, strict)
