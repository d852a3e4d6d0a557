"""From config to optimizer: parameter groups, the base optimizer class, the variant.

The runner builds one parameter group per (functional block, kind): the block is the
model's top-level child that owns the parameter (normalisation layers sit in their
layer's block), the kind is ``weight`` (conv, linear and normalisation weights) or
``bias``, split further by ``hidden`` (a Linear/Conv weight other than the first layer's and
the head's; see blocks.py) and ``use_muon`` (hidden 2-D matrices). Variants and the Muon base
optimizer read these keys; weight decay applies to every group, as in the SAM paper.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import require
from . import VARIANTS
from .blocks import hidden_weights, top_level_blocks
from .muon import MuonWithAdamW

BASE_OPTIMIZERS = ("sgd", "adamw", "muon")
ENGINE_KEYS = ("rho", "rho_schedule", "interval", "sync_perturbation", "perturb_with_weight_decay")


def parameter_groups(model: nn.Module) -> list[dict]:
    hidden = hidden_weights(model)
    owner = top_level_blocks(model)
    by_key: dict[tuple, list] = {}  # (block, kind, hidden, use_muon) -> params, in model order
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        kind = "bias" if p.ndim <= 1 and n.endswith("bias") else "weight"
        h = id(p) in hidden
        by_key.setdefault((owner[id(p)], kind, h, h and p.ndim == 2), []).append(p)
    # blocks in model order; within a block weights before biases, Muon matrices first
    blocks = list(dict.fromkeys(owner[id(p)] for p in model.parameters()))
    order = sorted(by_key, key=lambda k: (blocks.index(k[0]), k[1] == "bias", not k[3], not k[2]))
    return [dict(params=by_key[k], block=k[0], kind=k[1], hidden=k[2], use_muon=k[3]) for k in order]


def base_optimizer_class(cfg):
    """(class, kwargs) for ``base_optimizer`` config."""
    name = cfg.name
    require(name in BASE_OPTIMIZERS, f"base_optimizer={name!r} is unknown; choose one of {', '.join(BASE_OPTIMIZERS)}")
    lr = cfg.lr
    require(isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0,
            f"base_optimizer.lr={lr} must be a finite number > 0")
    wd = float(cfg.get("weight_decay", 0.0))
    require(wd >= 0, f"base_optimizer.weight_decay={wd} must be >= 0")
    if name == "sgd":
        return torch.optim.SGD, dict(lr=lr, momentum=float(cfg.get("momentum", 0.0)),
                                     nesterov=bool(cfg.get("nesterov", False)), weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW, dict(lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))), weight_decay=wd)
    return MuonWithAdamW, dict(lr=lr, momentum=float(cfg.get("momentum", 0.95)),
                               betas=tuple(cfg.get("betas", (0.9, 0.999))), weight_decay=wd)


def build_optimizer(cfg, model: nn.Module, total_steps: int):
    """The SAM variant named by ``cfg.optimizer.name`` around the configured base optimizer."""
    opt_cfg = dict(cfg.optimizer)
    name = opt_cfg.pop("name")
    require(name in VARIANTS, f"optimizer={name!r} is unknown; choose one of {', '.join(VARIANTS)}")
    cls = VARIANTS[name]
    rho = opt_cfg.get("rho", 0.0)
    if cls.no_rho_hint:
        # no fixed radius (le_sam): a swept optimizer.rho would silently mean nothing for these jobs
        require(rho is None, f"optimizer.rho={rho} does not apply to {name}; {cls.no_rho_hint}")
        opt_cfg.pop("rho", None)
    require(rho is None or (isinstance(rho, (int, float)) and math.isfinite(rho) and rho >= 0),
            f"optimizer.rho={rho} must be a finite number >= 0")
    interval = opt_cfg.get("interval", 1)
    require(isinstance(interval, int) and interval >= 1, f"optimizer.interval={interval} must be an integer >= 1")
    base_cls, base_kwargs = base_optimizer_class(cfg.base_optimizer)
    try:
        return cls(parameter_groups(model), base_cls, total_steps=total_steps, **opt_cfg, **base_kwargs)
    except (ValueError, TypeError) as e:
        from ..errors import UserError
        raise UserError(f"optimizer={name}: {e}") from None
