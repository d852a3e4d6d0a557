"""From config to optimizer: parameter groups, the base optimizer class, the variant.

The runner builds one parameter group per (functional block, kind): the block is the
model's top-level child that owns the parameter (normalisation layers sit in their
layer's block), the kind is ``weight`` (conv, linear and normalisation weights) or
``bias``. Groups carry ``block``, ``kind``, ``hidden`` (not the first block nor the head) and
``use_muon`` (2-D hidden matrices) keys that variants and the Muon base optimizer read;
weight decay applies to every group, as in the SAM paper.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import require
from . import VARIANTS
from .muon import MuonWithAdamW

BASE_OPTIMIZERS = ("sgd", "adamw", "muon")
ENGINE_KEYS = ("rho", "rho_schedule", "interval", "sync_perturbation", "perturb_with_weight_decay")


def parameter_groups(model: nn.Module) -> list[dict]:
    groups = []
    children = list(model.named_children()) or [("model", model)]
    own = [p for p in model.parameters(recurse=False)]
    first_block, last_block = children[0][0], children[-1][0]
    for block, module in children + ([("root", None)] if own else []):
        named = list(module.named_parameters()) if module is not None else [(f"p{i}", p) for i, p in enumerate(own)]
        weights = [p for n, p in named if p.requires_grad and (p.ndim > 1 or not n.endswith("bias"))]
        biases = [p for n, p in named if p.requires_grad and p.ndim <= 1 and n.endswith("bias")]
        hidden = block not in (first_block, last_block)
        matrices = [p for p in weights if p.ndim == 2 and hidden]
        rest = [p for p in weights if not (p.ndim == 2 and hidden)]
        for kind, params, muon in (("weight", matrices, True), ("weight", rest, False), ("bias", biases, False)):
            if params:
                groups.append(dict(params=params, block=block, kind=kind, use_muon=muon, hidden=hidden))
    return groups


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
        # no fixed radius: a swept optimizer.rho would silently mean nothing for these jobs
        require(rho is None, f"optimizer.rho={rho} does not apply to {name} (no fixed radius); {cls.no_rho_hint}")
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
