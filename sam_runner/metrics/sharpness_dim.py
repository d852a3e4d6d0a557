"""The sharpness dimension (``sharpness_dim``; Tuci, Korkmaz, Şimşekli & Birdal 2026,
"Generalization at the Edge of Stability"): the Lyapunov (Kaplan–Yorke) dimension of the
optimizer's one-step map at the weights, from the full Hessian spectrum.

For gradient descent θ ↦ θ − η∇L the Jacobian is I − ηH, whose Lyapunov exponents are
χᵢ = log|1 − ηλᵢ|. Sorted descending, k is the largest j with χ₁ + … + χⱼ ≥ 0 (0 if χ₁ < 0) and
the dimension is k + (χ₁ + … + χₖ)/|χₖ₊₁| (the count n when every partial sum is ≥ 0).

Heavy-ball momentum β (PyTorch's SGD, no dampening) steps on (θ, b): b' = βb + ∇L(θ),
θ' = θ − ηb'. Along an eigenvector of H with eigenvalue λ its Jacobian is the 2×2 matrix
[[1 − ηλ, −ηβ], [λ, β]], whose eigenvalues μ solve μ² − (1 + β − ηλ)μ + β = 0: the map has 2n
exponents log|μ|, and the dimension is of that 2n-dimensional map (β = 0 gives the GD exponents
and n exponents −∞, which do not change the dimension). Coupled weight decay w adds w to every λ.

Our choices (the paper averages the exponents over the attractor, i.e. over many iterates):
we take the Jacobian at the measured weights, of the loss on the measurement subset, so one
measurement is one point of the attractor; a run that measures every few epochs logs a series
whose late mean is the attractor average. The spectrum is exact (a dense Hessian, one HVP per
parameter) up to ``max_dense`` parameters; beyond, it is estimated: n eigenvalues as the
quantiles of the SLQ density (``spectral_density``, shared with the density measure), the i-th
of n at cumulative weight (i + ½)/n, the largest ``top_k`` replaced by Lanczos' (0 by default:
SLQ's extreme Ritz values already sit on the extreme eigenvalues). The step is the run's
configured learning rate (the schedule's peak) unless ``metrics.sharpness_dim.lr`` is given, and
the measure needs an SGD base optimizer (another base optimizer's map is not gradient descent's:
the key is left out).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Iterable

    from omegaconf import DictConfig

    from .hvp import HessianOperator


def exponents(
    eigenvalues: Iterable[float], lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> list:
    """The one-step map's Lyapunov exponents at a point with these Hessian eigenvalues (float64,
    vectorised: the 2×2 blocks' eigenvalues in closed form)."""
    lam = torch.as_tensor(list(eigenvalues), dtype=torch.float64) + weight_decay
    a = 1.0 - lr * lam
    if momentum == 0.0:
        return a.abs().log().tolist()  # log 0 = −inf where lr·λ = 1
    # the roots of μ² − (a + β)μ + β = 0
    half = (a + momentum).to(torch.complex128) / 2
    root = torch.sqrt(half * half - momentum)
    moduli = torch.stack([(half + root).abs(), (half - root).abs()], 1).reshape(-1)
    return moduli.log().tolist()


def kaplan_yorke(chis: Iterable[float]) -> float:
    """k + (χ₁ + … + χₖ)/|χₖ₊₁| over the exponents sorted descending (module docstring)."""
    chis = sorted((float(c) for c in chis), reverse=True)
    total, k = 0.0, 0
    for c in chis:
        if total + c < 0:
            break
        total += c
        k += 1
    if k == len(chis):
        return float(k)
    return k + (total / abs(chis[k]) if math.isfinite(chis[k]) else 0.0)


def sharpness_dimension(
    eigenvalues: Iterable[float], lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> float:
    """The Kaplan–Yorke dimension of θ ↦ θ − lr·∇L (with ``momentum``: the heavy-ball map) at a
    point whose Hessian has these eigenvalues (module docstring)."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr={lr!r} must be a finite number > 0")
    return kaplan_yorke(exponents(eigenvalues, float(lr), float(momentum), float(weight_decay)))


def dense_eigenvalues(op: HessianOperator) -> torch.Tensor:
    """Every eigenvalue of the operator's Hessian (float64), from H built column by column."""
    from .solvers import PROBE_BLOCK

    n = op.numel
    H = torch.empty(n, n, dtype=torch.float64)
    for i in range(0, n, PROBE_BLOCK):
        rows = min(PROBE_BLOCK, n - i)
        E = torch.zeros(rows, n, device=op.device, dtype=op.dtype)
        E[torch.arange(rows), i + torch.arange(rows)] = 1.0
        H[i : i + rows] = op.hvp_batch(E).double().cpu()
    return torch.linalg.eigvalsh((H + H.T) / 2)


def density_quantiles(density: dict, n: int) -> torch.Tensor:
    """n eigenvalues spread as the SLQ density: the i-th at cumulative weight (i + ½)/n."""
    nodes = torch.tensor([x for run in density["nodes"] for x in run], dtype=torch.float64)
    weights = torch.tensor([w for run in density["weights"] for w in run], dtype=torch.float64)
    order = nodes.argsort()
    nodes, weights = nodes[order], weights[order]
    cumulative = torch.cumsum(weights, 0) / weights.sum()
    targets = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    index = torch.searchsorted(cumulative, targets).clamp(max=len(nodes) - 1)
    return nodes[index]


def estimated_eigenvalues(
    op: HessianOperator, top_k: int, density: dict, seed: int
) -> torch.Tensor:
    """n eigenvalues: the quantiles of the SLQ ``density`` (spectral_density's), the largest
    ``top_k`` of them replaced by the top eigenvalues by Lanczos (0: the quantiles alone)."""
    from .solvers import top_hessian_eigenvalues

    n = op.numel
    rest = density_quantiles(density, n).sort().values
    k = min(top_k, n)
    if k == 0:
        return rest
    top = top_hessian_eigenvalues(op.model, op.loss_fn, op.batches, k, seed=seed, operator=op)
    return torch.cat([torch.tensor(top, dtype=torch.float64), rest[: n - k]])


def sgd_step(cfg: DictConfig | None) -> dict | None:
    """{lr, momentum, weight_decay} of a run's configured SGD base optimizer, else None."""
    base = cfg.get("base_optimizer") if cfg is not None else None
    if base is None or str(base.get("name", "")) != "sgd" or bool(base.get("nesterov", False)):
        return None
    return {
        "lr": float(base.get("lr", 0.0)),
        "momentum": float(base.get("momentum", 0.0) or 0.0),
        "weight_decay": float(base.get("weight_decay", 0.0) or 0.0),
    }


def step_for(metrics_cfg: DictConfig, cfg: DictConfig | None) -> dict | None:
    """The SGD step the sharpness dimension of this run uses (``sgd_step``, its lr replaced by
    ``metrics.sharpness_dim.lr`` when given); a one-line error, before anything runs, when the
    measure is on and that step is 0."""
    from ..errors import require

    step = sgd_step(cfg)
    section = (metrics_cfg or {}).get("sharpness_dim") or {}
    if step is None or not section.get("enabled", False):
        return step
    if section.get("lr") is not None:
        step = dict(step, lr=float(section["lr"]))
    require(
        step["lr"] > 0,
        f"metrics.sharpness_dim needs a step size > 0: base_optimizer.lr={step['lr']!r}; give "
        "metrics.sharpness_dim.lr=... or turn it off (metrics.sharpness_dim.enabled=false)",
    )
    return step
