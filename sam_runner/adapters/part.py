"""Fine-tuning as run parts: the given weights (``model.init_from``) and the adapters on them
(``model.peft``), applied to the model right after it is built, before the optimizer sees its
parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf

from ..data.sources import data_shape
from ..models import build_model, check_initial_weights, load_initial_weights, without_download
from ..part import Part
from ..registry import DATASETS
from . import attach_adapters, method

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..part import Run


class Record(Part):
    """A part that only reports what was applied to the model, under one summary key."""

    def __init__(self, key: str, record: dict) -> None:
        self.key, self.record = key, record

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        """``{key: record}``."""
        return {self.key: self.record}


def build_pretrained(run: Run) -> Record | None:
    """``model.init_from``'s weights loaded into the model (None without them)."""
    record = load_initial_weights(run.cfg.model, run.model)
    return None if record is None else Record("init_from", record)


def check_pretrained(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """``model.init_from`` exists and fits the model, before anything is read or trained."""
    shape, classes = data_shape(cfg.dataset)
    known = DATASETS.entry(cfg.dataset.name).num_classes is not None
    check_initial_weights(without_download(cfg.model), shape, classes, known)


def build_part(run: Run) -> Record | None:
    """``model.peft``'s adapters on the model, everything else frozen (None without them)."""
    record = attach_adapters(run.cfg.model, run.model, run.data.input_shape)
    if record is not None and record.get("library") == "peft":
        from .hf_peft import PeftPart

        return PeftPart(run.model, record)
    return None if record is None else Record("peft", record)


def check(cfg: DictConfig, where: object = None) -> None:
    """``model.peft``'s keys and targets on the model (built on the meta device); an earlier
    stage's ``model.init_from`` (``where.awaiting``) is taken as set."""
    if method(cfg.model) == "none":
        return
    model_cfg = cfg.model
    awaiting = getattr(where, "awaiting", frozenset())
    if model_cfg.get("init_from") in (None, "") and "model.init_from" in awaiting:
        # an earlier stage's job, not run yet: its weights are checked when this stage starts
        model_cfg = OmegaConf.merge(model_cfg, {"init_from": "(an earlier stage's job)"})
    with torch.device("meta"):
        shape, classes = data_shape(cfg.dataset)
        attach_adapters(model_cfg, build_model(without_download(model_cfg), shape, classes), shape)
