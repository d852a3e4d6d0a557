"""The base optimizers a SAM variant steps with (``base_optimizer=<name>``): each entry maps the
group's config to ``(optimizer class, keyword arguments)``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..circuits.em import EM
from ..errors import number, require
from ..registry import BASE_OPTIMIZERS
from .lion import KS, Lion, LionK
from .muon import MuonWithAdamW

if TYPE_CHECKING:
    from omegaconf import DictConfig


def common_kwargs(cfg: DictConfig) -> dict:
    """lr and weight decay, checked (every base optimizer takes them)."""
    lr = number("base_optimizer.lr", cfg.lr, "a finite number > 0", lambda v: 0 < v < math.inf)
    wd = number(
        "base_optimizer.weight_decay",
        cfg.get("weight_decay", 0.0),
        "a number >= 0",
        lambda v: 0 <= v < math.inf,
    )
    return dict(lr=lr, weight_decay=wd)


def _momentum(cfg, default: float) -> float:
    return number(
        "base_optimizer.momentum",
        cfg.get("momentum", default),
        "a number in [0, 1)",
        lambda m: 0 <= m < 1,
    )


def _betas(cfg, default=(0.9, 0.999)) -> tuple:
    betas = cfg.get("betas", default)
    accepted = "two numbers in [0, 1), e.g. base_optimizer.betas=[0.9,0.999]"
    require(
        isinstance(betas, Sequence) and not isinstance(betas, str) and len(betas) == 2,
        f"base_optimizer.betas={betas!r} must be {accepted}",
    )
    return tuple(number("base_optimizer.betas", b, accepted, lambda v: 0 <= v < 1) for b in betas)


@BASE_OPTIMIZERS.register("sgd", "SGD with momentum (lr 0.1, momentum 0.9, weight decay 5e-4)")
def sgd(cfg: DictConfig) -> tuple[type[torch.optim.Optimizer], dict]:
    """``torch.optim.SGD`` and its keyword arguments (momentum, Nesterov)."""
    return torch.optim.SGD, dict(
        **common_kwargs(cfg),
        momentum=_momentum(cfg, 0.0),
        nesterov=bool(cfg.get("nesterov", False)),
    )


@BASE_OPTIMIZERS.register("adamw", "AdamW (decoupled weight decay)")
def adamw(cfg: DictConfig) -> tuple[type[torch.optim.Optimizer], dict]:
    """``torch.optim.AdamW`` and its keyword arguments (betas)."""
    return torch.optim.AdamW, dict(**common_kwargs(cfg), betas=_betas(cfg))


@BASE_OPTIMIZERS.register("muon", "torch.optim.Muon on 2-D hidden matrices, AdamW on the rest")
def muon(cfg: DictConfig) -> tuple[type[torch.optim.Optimizer], dict]:
    """Muon on hidden matrices with AdamW on the rest, and its keyword arguments."""
    return MuonWithAdamW, dict(
        **common_kwargs(cfg), momentum=_momentum(cfg, 0.95), betas=_betas(cfg)
    )


@BASE_OPTIMIZERS.register("lion", "Lion: the sign of interpolated momentum (lr 3e-4, wd 0.15)")
def lion(cfg: DictConfig) -> tuple[type[torch.optim.Optimizer], dict]:
    """Lion and its keyword arguments (betas)."""
    return Lion, dict(**common_kwargs(cfg), betas=_betas(cfg, (0.9, 0.99)))


@BASE_OPTIMIZERS.register("lion_k", "Lion-K: Lion with the gradient of a convex K (l1, l2, huber)")
def lion_k(cfg: DictConfig) -> tuple[type[torch.optim.Optimizer], dict]:
    """Lion-K and its keyword arguments (``k``, ``delta``), checked."""
    k = cfg.get("k", "l1")
    require(k in KS, f"base_optimizer.k={k!r} is unknown; choose {', '.join(KS)}")
    delta = number(
        "base_optimizer.delta", cfg.get("delta", 1.0), "a finite number > 0",
        lambda d: 0 < d < math.inf,
    )  # fmt: skip
    return LionK, dict(**common_kwargs(cfg), betas=_betas(cfg, (0.9, 0.99)), k=k, delta=delta)


@BASE_OPTIMIZERS.register(
    "em", "mini-batch EM on a circuit's weights (model=pc; lr: the step size)"
)
def em(cfg: DictConfig) -> tuple[type[torch.optim.Optimizer], dict]:
    """The EM step of a probabilistic circuit's sum weights and its keyword arguments (step size,
    pseudocount), checked."""
    lr = number("base_optimizer.lr", cfg.lr, "a step size in (0, 1]", lambda v: 0 < v <= 1)
    alpha = number(
        "base_optimizer.pseudocount",
        cfg.get("pseudocount", 0.0),
        "a number >= 0",
        lambda v: 0 <= v < math.inf,
    )
    return EM, dict(lr=lr, pseudocount=alpha)
