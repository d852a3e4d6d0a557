"""What a measurement logs about the training dynamics beside λ_max: the stability threshold of
the step it is taking, the SAM edge of stability, and how much of the gradient lies in the
dominant eigenspace.

- ``eos_threshold``: the largest curvature at which the base optimizer is stable on a quadratic
  (2/η for plain gradient descent; stability.py), and ``eos_ratio`` = λ_max / that.
- ``sam_edge`` (runs of ``optimizer=sam`` with plain SGD): the SAM edge of stability, the
  stability limit of SAM on a quadratic derived here (the edge itself: Long & Bartlett 2023).
  Along the top eigenvector of a quadratic with curvature λ, a SAM step with ε = ρ g/‖g‖
  multiplies the coordinate by 1 − ηλ(1 + ρλ/‖g‖), ‖g‖ the norm of the whole gradient;
  it is stable while ηλ(1 + ρλ/‖g‖) ≤ 2, that is while λ ≤ (‖g‖/(2ρ))(√(1 + 8ρ/(η‖g‖)) − 1),
  which is below 2/η and tends to it as ρ → 0. ‖g‖ is the gradient on the measured samples (with
  a full batch, the training gradient). ``sam_edge_ratio`` = λ_max / ``sam_edge``. Only for
  full-batch training (``dataset.batch_size=full``): with mini-batches each step's ‖g‖ is the
  batch's, and the edge above is not the one the steps face.
- ``grad_topk_overlap`` (``metrics.hessian.grad_topk_overlap``): ‖P_k g‖²/‖g‖², P_k the projector
  onto the k Ritz vectors of this Lanczos run: the share of the gradient in the top-k Hessian
  eigenspace (Gur-Ari et al. 2018 observed that it is most of it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .stability import sam_edge, stability_threshold

if TYPE_CHECKING:
    from .hvp import HessianOperator
    from .solvers import EigenResult


def dynamics(
    op: HessianOperator,
    result: EigenResult,
    optimizer: torch.optim.Optimizer,
    overlap: bool,
    full_batch: bool,
) -> dict:
    """The keys above for one Lanczos ``result`` on the operator ``op``; the SAM edge only when
    every step takes the full batch (``full_batch``), the setting it is derived in."""
    out = {}
    threshold = stability_threshold(optimizer)
    if threshold:  # None: no threshold; 0: a weight decay that leaves no stable curvature ≥ 0
        out["eos_ratio"] = result.values[0] / threshold
        if math.isfinite(threshold):
            out["eos_threshold"] = threshold
    wants_edge = full_batch and sam_edge(optimizer, 1.0) is not None
    if not (overlap or wants_edge):
        return out
    g = op.gradient().double()  # a sharded operator's: this process's chunk (op.reduce_sum)
    g_squared = float(_summed(op, g.square().sum()))
    g_norm = math.sqrt(g_squared)
    if wants_edge and g_norm > 0:
        edge = sam_edge(optimizer, g_norm)
        out.update(sam_edge=edge, sam_edge_ratio=result.values[0] / edge)
        out["grad_norm"] = g_norm
    if overlap and g_norm > 0:
        coefficients = _summed(op, result.ritz_vectors.to(g.dtype) @ g)
        out["grad_topk_overlap"] = float(coefficients.square().sum()) / g_squared
    return out


def _summed(op: HessianOperator, t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the processes when each holds a chunk of the operator's vectors."""
    return t if op.reduce_sum is None else op.reduce_sum(t)


def topk_overlap(g: torch.Tensor, vectors: torch.Tensor) -> float:
    """‖P g‖²/‖g‖² for the projector P onto the rows of ``vectors`` (orthonormal)."""
    coefficients = vectors.to(g.dtype) @ g
    return float(coefficients.square().sum() / g.square().sum())
