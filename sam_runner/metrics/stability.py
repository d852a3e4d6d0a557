"""Where a step-size rule stops being stable on a quadratic: the edge-of-stability thresholds."""

from __future__ import annotations

import math

import torch


def inverse_stability_threshold(optimizer) -> float | None:
    """1 / (the largest curvature at which the base optimizer's iteration on a 1-D quadratic is
    stable), so that eos_ratio = λ_max · this. With lr η, momentum β and dampening d (PyTorch's
    SGD: b ← βb + (1−d)g; heavy ball steps along b, Nesterov along g + βb) the iteration's
    characteristic polynomial has its root at −1 when λ reaches
      plain SGD 2/η;  heavy ball (2+2β)/(η(1−d));  Nesterov (2+2β)/(η(1+β(2−d))).
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
        return lr * (1 + beta * (2 - d)) / (2 + 2 * beta)
    return lr * (1 - d) / (2 + 2 * beta)


def stability_threshold(optimizer) -> float | None:
    """The threshold itself (``math.inf`` at η = 0); see ``inverse_stability_threshold``."""
    inv = inverse_stability_threshold(optimizer)
    return None if inv is None else (1 / inv if inv > 0 else math.inf)
