"""The Hessian's Gauss–Newton part and the rest, and the Hessian per block of parameters.

The Hessian of the mean loss L(θ) = Σ_i w_i ℓ(f(x_i; θ), y_i) splits into
H = G + R: the generalized Gauss–Newton matrix G = Σ_i w_i J_iᵀ H_ℓ,i J_i (J_i the Jacobian of
the network's outputs, H_ℓ,i the loss's Hessian in the outputs), which depends on the function
only through its Jacobian, and R = H − G, the outputs' own curvature weighted by the loss's
derivative (the split Functional-SAM is argued with). G v is computed with ``torch.func``:
a forward-mode product J v, the loss's Hessian-vector product in the outputs, and a
reverse-mode product Jᵀ(·), per batch (no library: curvlinops' GGN operator would do the same
arithmetic; ``torch.func`` keeps the runner free of another dependency). The top eigenvalues
come from the same Lanczos as λ_max.

Blocks are GEAR-SAM's (optim/blocks.py): the model's top-level children, parameters held by
the root form ``root``. λ_max of a block is that of its diagonal block H_bb of the Hessian
(v ↦ (H [v_b; 0])_b).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.func import functional_call, grad, jvp, vjp

from ..optim.blocks import ROOT
from .objective import Objective, mean_loss
from .solvers import lanczos

if TYPE_CHECKING:
    from .hvp import HessianOperator

TOL, MAX_ITER = 1e-3, 100  # as metrics.hessian's defaults


def ggn_product(objective: Objective, v: torch.Tensor) -> torch.Tensor:
    """G v for the flat vector ``v``, G the Gauss–Newton matrix of the objective's mean loss."""
    names, params = objective.names, tuple(p.detach() for p in objective.params)
    tangents = tuple(objective.unflat(v.to(objective.dtype)))
    out = torch.zeros(objective.numel, device=objective.device, dtype=objective.dtype)
    for (x, y), weight in zip(objective.batches, objective.weights):

        def outputs(*ps, x=x):
            return functional_call(objective.model, dict(zip(names, ps)), (x,))

        def loss_of(z, y=y, weight=weight):
            return mean_loss(objective.loss_fn(z, y)) * weight

        z, jv = jvp(outputs, params, tangents)
        _, hjv = jvp(grad(loss_of), (z.detach(),), (jv,))
        _, pullback = vjp(outputs, *params)
        out += objective.flat(pullback(hjv))
    return out


def _top(matvec, n, device, seed: int, tol: float, max_iter: int) -> float:
    g = torch.Generator().manual_seed(seed)  # its own draws: the run's RNG stays untouched
    return float(lanczos(matvec, n, 1, tol, max_iter, generator=g, device=device).values[0])


def ggn_eigenvalues(
    op: HessianOperator, seed: int = 0, tol: float = TOL, max_iter: int = MAX_ITER
) -> dict:
    """``lambda_max_ggn`` (top eigenvalue of G) and ``lambda_max_residual`` (largest eigenvalue of
    H − G) on a HessianOperator ``op`` (its model, loss and batches)."""
    gv = lambda v: ggn_product(op, v)  # noqa: E731
    top_g = _top(gv, op.numel, op.device, seed, tol, max_iter)
    top_r = _top(lambda v: op(v) - gv(v), op.numel, op.device, seed, tol, max_iter)
    return {"lambda_max_ggn": top_g, "lambda_max_residual": top_r}


def parameter_blocks(names: list[str]) -> dict[str, list[int]]:
    """Block name → indices into ``names`` (dotted parameter names): the first component, or
    ``root`` for a parameter held by the model itself (GEAR-SAM's blocks)."""
    blocks: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        blocks.setdefault(n.split(".", 1)[0] if "." in n else ROOT, []).append(i)
    return blocks


def block_eigenvalues(
    op: HessianOperator, seed: int = 0, tol: float = TOL, max_iter: int = MAX_ITER
) -> dict:
    """``lambda_max_block_<block>``: the top eigenvalue of each diagonal block H_bb."""
    sizes = [p.numel() for p in op.params]
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    out = {}
    own = getattr(getattr(op, "model", None), "parameter_blocks", None)
    if callable(own):  # a model that names its blocks (model=hf's layers), as GEAR-SAM reads them
        owner, groups = own(), {}
        for i, p in enumerate(op.params):
            groups.setdefault(owner.get(id(p), ROOT), []).append(i)
    else:
        groups = parameter_blocks(op.names)
    for block, idx in groups.items():
        spans = [(starts[i], starts[i + 1]) for i in idx]
        n = sum(b - a for a, b in spans)

        def matvec(v, spans=spans):
            full = torch.zeros(op.numel, device=op.device, dtype=op.dtype)
            at = 0
            for a, b in spans:
                full[a:b] = v[at : at + b - a]
                at += b - a
            hv = op(full)
            return torch.cat([hv[a:b] for a, b in spans])

        out[f"lambda_max_block_{block}"] = _top(matvec, n, op.device, seed, tol, max_iter)
    return out
