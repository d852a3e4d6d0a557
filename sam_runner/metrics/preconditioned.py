"""The preconditioned sharpness of Adam-family runs (Cohen et al. 2022, "Adaptive Gradient
Methods at the Edge of Stability").

Adam steps θ ← θ − η P⁻¹ m with P = (1 − β₁ᵗ)·diag(√v̂ + ε), v̂ = v/(1 − β₂ᵗ) its bias-corrected
second moment; on a quadratic with Hessian H the iteration is stable while the top eigenvalue of
P⁻¹H stays below (2 + 2β₁)/((1 − β₁)η), the threshold at which heavy-ball momentum β₁ with step
η loses stability. P⁻¹H is similar to the symmetric P^(−1/2) H P^(−1/2), whose top eigenvalue
Lanczos finds from HVPs: v ↦ s ⊙ H(s ⊙ v), s = diag(P)^(−1/2), P frozen at the measured step.
Decoupled weight decay (AdamW) adds no curvature to the loss the preconditioner sees, and is
left out of the threshold, as in the paper.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .solvers import lanczos

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .hvp import HessianOperator

TOL, MAX_ITER = 1e-3, 100  # as metrics.hessian's defaults


def adam_preconditioner(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, float] | None:
    """(diag(P) flattened over ``params``, the threshold), or None when the base optimizer is
    not Adam or AdamW, or has not stepped on every parameter yet."""
    base = getattr(optimizer, "base_optimizer", optimizer)
    if not isinstance(base, torch.optim.Adam):  # AdamW is an Adam
        return None
    group = base.param_groups[0]
    (b1, b2), eps, lr = group["betas"], float(group["eps"]), float(group["lr"])
    parts = []
    for p in params:
        state = base.state.get(p) or {}
        if "exp_avg_sq" not in state:
            return None
        t = float(state["step"])
        v_hat = state["exp_avg_sq"] / (1 - b2**t)
        parts.append(((1 - b1**t) * (v_hat.sqrt() + eps)).reshape(-1))
    threshold = (2 + 2 * b1) / ((1 - b1) * lr) if lr > 0 else float("inf")
    return torch.cat(parts), threshold


def preconditioned_sharpness(op: HessianOperator, optimizer: torch.optim.Optimizer) -> dict:
    """``precond_lambda_max`` = λ_max(P⁻¹H) on the operator ``op`` (a HessianOperator),
    ``precond_eos_threshold`` and ``precond_eos_ratio`` (not at η = 0); {} for other
    optimizers."""
    found = adam_preconditioner(optimizer, op.params)
    if found is None:
        return {}
    diag, threshold = found
    s = diag.to(op.device, op.dtype).rsqrt()
    g = torch.Generator().manual_seed(0)  # its own draws: the run's RNG stays untouched
    matvec = lambda v: s * op(s * v)  # noqa: E731
    result = lanczos(matvec, op.numel, 1, TOL, MAX_ITER, generator=g, device=op.device)
    top = float(result.values[0])
    out = {"precond_lambda_max": top}
    if math.isfinite(threshold):  # η = 0 (a schedule's end): no threshold, as eos_threshold
        out.update(precond_eos_threshold=threshold, precond_eos_ratio=top / threshold)
    return out
