"""From config to optimizer: parameter groups, the base optimizer, the variant.

The runner builds one parameter group per (functional block, kind): the block is the
model's top-level child that owns the parameter (normalisation layers sit in their
layer's block), the kind is ``weight`` (conv, linear and normalisation weights) or
``bias``, split further by ``hidden`` (a Linear/Conv weight other than the first layer's and
the head's; see blocks.py) and ``use_muon`` (hidden 2-D matrices). Variants and the Muon base
optimizer read these keys; weight decay applies to every group, as in the SAM paper.
"""

from __future__ import annotations

import math

from torch import nn

from ..errors import UserError, integer, number, require
from ..registry import BASE_OPTIMIZERS, VARIANTS
from ..weight_decay import build_weight_decay
from .blocks import hidden_weights, is_bias, top_level_blocks


def parameter_groups(model: nn.Module) -> list[dict]:
    hidden = hidden_weights(model)
    owner = top_level_blocks(model)
    by_key: dict[tuple, list] = {}  # (block, kind, hidden, use_muon) -> params, in model order
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        kind = "bias" if is_bias(n, p) else "weight"
        h = id(p) in hidden
        by_key.setdefault((owner[id(p)], kind, h, h and p.ndim == 2), []).append(p)
    # blocks in model order; within a block weights before biases, Muon matrices first
    blocks = list(dict.fromkeys(owner[id(p)] for p in model.parameters()))
    order = sorted(by_key, key=lambda k: (blocks.index(k[0]), k[1] == "bias", not k[3], not k[2]))
    return [
        dict(params=by_key[k], block=k[0], kind=k[1], hidden=k[2], use_muon=k[3]) for k in order
    ]


def variant_kwargs(cfg) -> tuple[type, dict]:
    """(variant class, its keyword arguments from the ``optimizer`` group), checked."""
    opt_cfg = dict(cfg.optimizer)
    entry = VARIANTS.entry(opt_cfg.pop("name"))
    rho = opt_cfg.get("rho")
    if entry.rho_refused:
        # no fixed radius (le_sam): a swept optimizer.rho would silently mean nothing for these jobs
        require(
            rho is None, f"optimizer.rho={rho} does not apply to {entry.name}; {entry.rho_refused}"
        )
        opt_cfg.pop("rho", None)
    if rho is not None:
        number("optimizer.rho", rho, "a finite number >= 0", lambda r: 0 <= r < math.inf)
    integer("optimizer.interval", opt_cfg.get("interval", 1), "an integer >= 1", lambda n: n >= 1)
    return entry.target, opt_cfg


def build_optimizer(
    cfg, model: nn.Module, total_steps: int, weight_decay=None, steps_per_epoch: int | None = None
):
    """The SAM variant named by ``cfg.optimizer.name`` around the configured base optimizer;
    ``weight_decay`` (sam_runner.weight_decay's rule; None: the config's) may split the groups
    per layer. ``steps_per_epoch``: the optimizer steps of an epoch (``perturb_from`` as an
    epoch)."""
    cls, kwargs = variant_kwargs(cfg)
    base_cls, base_kwargs = BASE_OPTIMIZERS.build(cfg.base_optimizer.name, cfg.base_optimizer)
    weight_decay = build_weight_decay(cfg) if weight_decay is None else weight_decay
    groups = weight_decay.split(parameter_groups(model), model)
    try:
        return cls(
            groups, base_cls, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
            **kwargs, **base_kwargs,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise UserError(f"optimizer={cfg.optimizer.name}: {e}") from None


def bind_dataset(optimizer, data) -> None:
    """What a variant needs of the training set and its config left unset: Focal-SAM's class
    counts, bSAM's number of examples N."""
    if getattr(optimizer, "class_counts", 0) is None and data.class_counts:
        optimizer.set_class_counts(data.class_counts)
    if getattr(optimizer, "num_data", 0) is None and data.train_size:
        optimizer.set_num_data(data.train_size)
