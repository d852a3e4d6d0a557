"""The training labels a run will train on, read before it starts: what a check that depends on
the data's size or classes (a federated split) needs to refuse a bad input before anything is
written. Only labels are kept; a sweep's jobs over the same dataset read them once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from ..errors import UserError
from ..registry import DATASETS
from .labels import training_labels, validation_split

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

_RAW: dict[str, tuple | None] = {}  # the dataset config (as YAML) → (labels, class count)


def planned_labels(cfg: DictConfig, seed: int) -> torch.Tensor | None:
    """The training labels a run of dataset config ``cfg`` trains on, as ``build_data`` makes
    them (the validation split held out, ``train_subset``, the long tail, label noise, from
    ``seed``), for one process. None where they cannot be read up front: a dataset that is not
    in ``data_dir`` yet (nothing is downloaded here), or a source without labels (token
    windows)."""
    raw = raw_labels(cfg)
    if raw is None:
        return None
    y, classes = raw
    pool, _ = validation_split(y, classes, cfg.get("val_split", 0), seed)
    return training_labels(cfg, y, classes, seed, 1, pool)[1]


def raw_labels(cfg: DictConfig) -> tuple[torch.Tensor, int] | None:
    """(the training split's labels before any study's cut, the class count), or None."""
    local = OmegaConf.merge(cfg, {"download": False})
    key = OmegaConf.to_yaml(local, resolve=True)
    if key not in _RAW:
        _RAW[key] = _read(local)
    return _RAW[key]


def _read(cfg):
    entry = DATASETS.entry(cfg.name)
    try:
        if entry.meta.get("labels_of"):  # a source that lists its labels without its inputs
            return entry.labels_of(cfg)
        if not entry.tensors:
            return None
        a = entry.target(cfg)
    except UserError:  # files still to download: the run reads (and checks) them once fetched
        return None
    return a.y, a.num_classes


def has_labels(name: str) -> bool:
    """Whether a dataset gives classification labels per training example (token data has
    none)."""
    entry = DATASETS.entry(name)
    return bool(entry.tensors or entry.meta.get("labels_of"))
