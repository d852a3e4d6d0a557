"""Directions in parameter space: one tensor per trainable parameter, in the model's order.

- ``filter_normalized`` (Li et al. 2018): a Gaussian direction whose every filter (a row of
  the parameter seen as [out, -1]: a convolution's output channel, a linear layer's neuron) is
  rescaled to the norm of the same filter of the weights. Parameters of one dimension or less
  (biases, BatchNorm's γ and β) get zero, as in the paper; with ``include_bias_bn`` each of them
  is one filter, rescaled to its own norm (our choice; the paper's code copies the weights
  there). Drawn on the CPU from ``torch.Generator().manual_seed(seed)`` in parameter order,
  then moved to the device: the same seed draws the same direction on any device, and the
  weight filters are the same with or without ``include_bias_bn``.
- ``hessian_directions``: the top-k eigenvectors of the Hessian of the loss on the given
  batches, from the runner's Lanczos (``metrics.solvers.lanczos`` on a ``HessianOperator``).
  Our choices: each is scaled to the norm a filter-normalized direction has (the norm of the
  weights it would perturb), so that a coordinate means the same relative move for both kinds;
  its sign makes ⟨v, θ⟩ ≥ 0 (an eigenvector's sign is arbitrary).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..metrics.hvp import HessianOperator
from ..metrics.solvers import lanczos
from ..module_state import modes_restored

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from torch import nn


def trainable(model: nn.Module) -> list:
    """The model's parameters that require a gradient."""
    return [p for p in model.parameters() if p.requires_grad]


def _filters_rescaled(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``d`` with each row rescaled to the norm of the same row of ``w`` (rows are filters)."""
    dn, wn = d.norm(dim=1, keepdim=True), w.norm(dim=1, keepdim=True)
    return d * torch.where(dn > 0, wn / dn, torch.zeros_like(dn))


def perturbed(p: torch.Tensor, include_bias_bn: bool) -> bool:
    """Whether a filter-normalized direction moves parameter ``p``."""
    return p.dim() > 1 or include_bias_bn


@torch.no_grad()
def filter_normalized(model: nn.Module, seed: int, include_bias_bn: bool = False) -> list:
    """A filter-normalized Gaussian direction (Li et al. 2018), drawn from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for p in trainable(model):
        d = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device, p.dtype)
        if not perturbed(p, include_bias_bn):
            out.append(torch.zeros_like(p))
            continue
        rows = len(p) if p.dim() > 1 else 1
        w = p.detach().reshape(rows, -1)
        out.append(_filters_rescaled(d.reshape(rows, -1), w).view_as(p))
    return out


def weight_norm(model: nn.Module, include_bias_bn: bool = False) -> float:
    """‖θ‖ over the parameters a filter-normalized direction moves (that direction's norm)."""
    return math.sqrt(
        sum(
            float(p.detach().double().pow(2).sum())
            for p in trainable(model)
            if perturbed(p, include_bias_bn)
        )
    )


def norm(direction: Iterable[torch.Tensor]) -> float:
    """The Euclidean norm of a direction (one tensor per parameter)."""
    return math.sqrt(sum(float(d.double().pow(2).sum()) for d in direction))


def hessian_directions(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    k: int,
    seed: int,
    options: dict,
    scale: float,
) -> tuple[list, list[float], dict]:
    """(the top-k Hessian eigenvectors as directions of norm ``scale``, their eigenvalues, what
    Lanczos did), at the model's current weights and modes.

    ``options``: ``tol``, ``max_iter``, ``method``, ``graph_cache_mb`` (the run's
    metrics.hessian settings)."""
    with (
        modes_restored(model),
        HessianOperator(
            model, loss_fn, batches, options["method"], options["graph_cache_mb"]
        ) as op,
    ):
        r = lanczos(
            op,
            op.numel,
            k,
            options["tol"],
            max(options["max_iter"], k),
            generator=torch.Generator().manual_seed(int(seed)),
            device=op.device,
        )
        theta = op.flat([p.detach() for p in op.params]).double()
        directions = []
        for v in r.vectors.double():
            v = v if float(torch.dot(v, theta)) >= 0 else -v
            directions.append([t.clone() for t in op.unflat((v * scale / v.norm()).to(op.dtype))])
    info = {"eigenvalues": r.values, "hvps": r.hvps, "converged": r.converged}
    return directions, r.values, info
