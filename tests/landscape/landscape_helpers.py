"""Tiny real runs for the landscape tests, each trained once per test session.

``trained`` trains with ``sam_runner.train.train`` (no mocks) into a session folder; with
``hydra=True`` it also writes ``.hydra/config.yaml`` and ``.hydra/overrides.yaml`` as Hydra
does when a job starts, otherwise the run has only its checkpoint's record of its settings (a
run trained without Hydra). Tests that write into a run folder work on a copy (``copy_run``).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from conftest import compose

# a few seconds each on two CPU cores
FAST = [
    "trainer.epochs=1",
    "dataset.num_samples=600",
    "metrics=off",
    "metrics.hessian.num_samples=256",
    "trainer.progress=none",
]
MLP = ["model=mlp", "model.hidden=[32]"]
CNN = ["model=cnn1d", "model.channels=8"]


@functools.lru_cache(maxsize=None)
def session_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="sam-landscape-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def write_hydra_files(run_dir: Path, cfg, overrides) -> None:
    from omegaconf import OmegaConf

    hydra = Path(run_dir) / ".hydra"
    hydra.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, hydra / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), hydra / "overrides.yaml")


def train_into(run_dir: Path, overrides, hydra: bool = True) -> Path:
    """A finished run in ``run_dir`` made with FAST plus ``overrides``."""
    from sam_runner.train import train

    cfg = compose(*FAST, *overrides)
    if hydra:
        write_hydra_files(run_dir, cfg, overrides)
    train(cfg, run_dir, list(overrides))
    return Path(run_dir)


@functools.lru_cache(maxsize=None)
def trained(*overrides: str, hydra: bool = True) -> Path:
    """A finished run of FAST plus ``overrides``, trained once per session (do not write in it)."""
    name = "_".join(o.replace("/", "-") for o in overrides) or "default"
    return train_into(session_root() / f"{name}{'' if hydra else '_nohydra'}", overrides, hydra)


def copy_run(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))
