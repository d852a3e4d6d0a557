"""Density estimation as a run's task (``model=pc``, ``trainer.loss=nll``): the settings it
takes (``check_config``, one-line errors), the data it accepts, and what its evaluation lines
carry in place of accuracy and ECE: ``train_ll``, ``test_ll`` (mean log-likelihood per example,
nats), ``test_bpd`` (bits per dimension, −test_ll / (D ln 2)), ``test_loss`` = ``test_nll`` =
−test_ll, and the exact curvature: ``hessian_trace_exact`` (of the mean log-likelihood in the
sum weights, over the curvature subset) and ``hessian_trace_depth_<t>``, its share at depth t."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..errors import UserError, require
from .curvature import trace_by_depth

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from torch import nn

    from ..data import Data
    from .circuit import ProbabilisticCircuit

BINARIZABLE = ("digits", "mnist1d", "arrays")
CIRCUIT_REGULARIZERS = ("pc_trace", "pc_adaptive")
EVAL_BATCH = 1024


def is_circuit(cfg: DictConfig) -> bool:
    """Whether the run's model is a probabilistic circuit (``model=pc``)."""
    return str(cfg.model.get("arch")) == "pc"


def check_config(cfg: DictConfig) -> None:
    """A circuit's settings, and a circuit's options on other models: one-line errors."""
    d = cfg.dataset
    binarize, reg = d.get("binarize", False), (cfg.get("regularizer") or {}).get("name", "none")
    require(isinstance(binarize, bool), f"dataset.binarize={binarize!r} must be true or false")
    require(
        not binarize or d.name in BINARIZABLE,
        f"dataset.binarize applies to {', '.join(BINARIZABLE)}, not dataset={d.name}",
    )
    arch, loss = cfg.model.get("arch"), cfg.trainer.get("loss", "cross_entropy")
    if cfg.base_optimizer.name == "em":
        require(is_circuit(cfg), f"base_optimizer=em trains a probabilistic circuit's weights "
                f"and model={arch} is not one: use model=pc, or a gradient base such as "
                "base_optimizer=sgd")  # fmt: skip
        require(cfg.optimizer.name == "base", f"base_optimizer=em takes optimizer=base, not "
                f"optimizer={cfg.optimizer.name}: the SAM variants apply to gradient training of "
                "a circuit (base_optimizer=sgd, adamw, ...)")  # fmt: skip
    if reg in CIRCUIT_REGULARIZERS:
        require(is_circuit(cfg), f"regularizer={reg} regularizes a probabilistic circuit's "
                f"Hessian trace and model={arch} is not one: use model=pc, or "
                "regularizer=none or jsd")  # fmt: skip
    if loss == "nll":
        require(is_circuit(cfg), f"trainer.loss=nll is a density model's loss and model={arch} "
                "is a classifier: use model=pc, or trainer.loss=cross_entropy")  # fmt: skip
    if is_circuit(cfg):
        _check_circuit_run(cfg, loss, reg, binarize)


def _check_circuit_run(cfg, loss, reg, binarize) -> None:
    d = cfg.dataset
    require(loss == "nll", f"model=pc is a density model: set trainer.loss=nll, not {loss}")
    fix = (
        "set dataset.binarize=true"
        if d.name in BINARIZABLE
        else f"use dataset.binarize=true on one of {', '.join(BINARIZABLE)}"
    )
    require(binarize, f"model=pc needs discrete data and dataset={d.name} is continuous "
            f"(arrays are standardised too): {fix}")  # fmt: skip
    require(reg == "none" or reg in CIRCUIT_REGULARIZERS, f"regularizer={reg} does not apply "
            f"to model=pc; use {', '.join(CIRCUIT_REGULARIZERS)} or none")  # fmt: skip
    precision = cfg.trainer.get("precision", "fp32")
    require(precision == "fp32", f"trainer.precision={precision} does not apply to model=pc "
            "(its log-space sums need float32); set trainer.precision=fp32")  # fmt: skip
    devices = cfg.trainer.get("devices", 1)
    require(cfg.base_optimizer.name != "em" or devices in (1, None), f"trainer.devices={devices} "
            "does not apply to base_optimizer=em yet (its statistics are not all-reduced); "
            "train on one process")  # fmt: skip
    averaging = cfg.trainer.get("weight_averaging", "none")
    require(averaging in (None, "none"), f"trainer.weight_averaging={averaging} does not apply "
            "to model=pc yet; set it to none")  # fmt: skip
    fed = (cfg.get("federated") or {}).get("name", "none")
    require(fed == "none", f"federated={fed} does not apply to model=pc; set it to none")
    for key in ("mixup_alpha", "cutmix_alpha", "label_noise", "val_split"):
        require(not d.get(key), f"dataset.{key}={d.get(key)} does not apply to model=pc "
                "(density estimation); set it to 0")  # fmt: skip


def check_data(data: Data, categories: int) -> None:
    """A circuit's data: every value an integer category in [0, categories)."""
    for name, x in (("training", data.train_tensors[0]), ("test", test_inputs(data))):
        ok = bool(((x == x.round()) & (x >= 0) & (x < categories)).all())
        if not ok:
            raise UserError(
                f"model=pc needs discrete data: the {name} inputs are not all integers in "
                f"[0, {categories}) (model.categories); set dataset.binarize=true"
            )


@torch.no_grad()
def mean_log_likelihood(model: nn.Module, x: torch.Tensor) -> float:
    """The mean log p(x) per example over the rows of x (in chunks)."""
    return float(sum(model(c).sum() for c in x.split(EVAL_BATCH)) / len(x))


def test_inputs(data: Data) -> torch.Tensor:
    """Every test input, in one tensor."""
    return torch.cat([x for x, *_ in data.test])


def test_values(model: nn.Module, data: Data, num_vars: int) -> dict:
    """A density model's test keys: ``test_ll``, ``test_bpd``, ``test_loss`` = ``test_nll``."""
    ll = mean_log_likelihood(model, test_inputs(data))
    return {"test_ll": ll, "test_loss": -ll, "test_nll": -ll,
            "test_bpd": -ll / (num_vars * math.log(2))}  # fmt: skip


def train_values(circuit: ProbabilisticCircuit, data: Data, subset: torch.Tensor) -> dict:
    """``train_ll`` (the whole training split), the exact trace on ``subset`` and its shares by
    depth."""
    depth = trace_by_depth(circuit, subset.split(EVAL_BATCH))
    return {
        "train_ll": mean_log_likelihood(circuit, data.train_tensors[0]),
        "hessian_trace_exact": sum(depth),
        **{f"hessian_trace_depth_{t}": v for t, v in enumerate(depth)},
    }
