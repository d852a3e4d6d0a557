"""Where a step-size rule stops being stable on a quadratic: the edge-of-stability thresholds."""

from __future__ import annotations

import math

import torch

from ..registry import VARIANTS


def inverse_stability_threshold(optimizer: torch.optim.Optimizer) -> float | None:
    """1 / (the largest curvature at which the base optimizer's iteration on a 1-D quadratic is
    stable), so that eos_ratio = λ_max · this. With lr η, momentum β and dampening d (PyTorch's
    SGD: b ← βb + (1−d)g; heavy ball steps along b, Nesterov along g + βb) the iteration's
    characteristic polynomial has its root at −1 when λ reaches
      plain SGD 2/η;  heavy ball (2+2β)/(η(1−d));  Nesterov (2+2β)/(η(1+β(2−d))).
    Coupled weight decay w (PyTorch's SGD steps along g + wθ) adds w to the curvature the
    iteration sees, so the loss's curvature may reach that threshold minus w.
    Finite, and 0 at η = 0 (end of a cosine-to-0 schedule), where the threshold is infinite.
    None unless the base optimizer is SGD, and for variants whose own step replaces the lr
    (``replaces_lr``, e.g. SAM-SPS's Polyak step)."""
    base = getattr(optimizer, "base_optimizer", optimizer)
    if getattr(optimizer, "replaces_lr", False) or not isinstance(base, torch.optim.SGD):
        return None
    group = base.param_groups[0]
    lr, beta = float(group["lr"]), float(group.get("momentum", 0.0) or 0.0)
    # without momentum there is no buffer
    d = float(group.get("dampening", 0.0) or 0.0) if beta else 0.0
    if group.get("nesterov", False):
        inverse = lr * (1 + beta * (2 - d)) / (2 + 2 * beta)
    else:
        inverse = lr * (1 - d) / (2 + 2 * beta)
    return _with_weight_decay(inverse, float(group.get("weight_decay", 0.0) or 0.0))


def _with_weight_decay(inverse: float, wd: float) -> float:
    """1 / (1/inverse − wd): the threshold lowered by the decay's curvature. A decay at or above
    the wd-free threshold leaves no stable curvature ≥ 0: the inverse is then infinite."""
    if wd == 0.0 or inverse == 0.0:
        return inverse
    rest = 1.0 - wd * inverse
    return inverse / rest if rest > 0 else math.inf


def stability_threshold(optimizer: torch.optim.Optimizer) -> float | None:
    """The threshold itself (``math.inf`` at η = 0); see ``inverse_stability_threshold``."""
    inv = inverse_stability_threshold(optimizer)
    return None if inv is None else (1 / inv if inv > 0 else math.inf)


def sam_edge(optimizer: torch.optim.Optimizer, grad_norm: float) -> float | None:
    """The SAM edge of stability: (‖g‖/(2ρ))(√(1 + 8ρ/(η‖g‖)) − 1), the stability limit of SAM on
    a quadratic, derived here (that SAM has such an edge: Long & Bartlett 2023), for
    ``optimizer=sam`` stepping with plain SGD (no momentum, the setting of the derivation); None
    otherwise, and at η = 0 or ρ = 0, where the edge is the GD threshold or infinite."""
    entry = VARIANTS.entry_of(type(optimizer))
    base = getattr(optimizer, "base_optimizer", None)
    if entry is None or entry.name != "sam" or not isinstance(base, torch.optim.SGD):
        return None
    group = base.param_groups[0]
    lr, rho = float(group["lr"]), float(optimizer.current_rho)
    if group.get("momentum", 0.0) or group.get("nesterov", False) or lr <= 0 or rho <= 0:
        return None
    return (grad_norm / (2 * rho)) * (math.sqrt(1 + 8 * rho / (lr * grad_norm)) - 1)
