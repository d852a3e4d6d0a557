"""The exact trace of the Hessian of a circuit's mean log-likelihood with respect to its sum
weights, and its per-node decomposition (docs/circuits.md derives both).

The Hessian is taken in the sum weights themselves, each weight w_ij one coordinate (the
ambient coordinates of the simplices: the circuit evaluated at the given weights, without
renormalisation), not in the logits the gradient-trained parameters are. p(x) is linear in each
node's weight vector (an induced tree passes a sum node at most once), so the diagonal entry is
∂²log p/∂w_ij² = −(∂log p/∂w_ij)², and with the node flow f_i(x) = ∂log p(x)/∂log p_i(x) and the
children's values c_j(x):

    tr H = −(1/N) Σ_x Σ_i f_i(x)² · s_i(x),    s_i(x) = Σ_j (c_j(x) / p_i(x))²

node i's term is its (squared) flow times a local term of its own children's values. Flows come
from one backward pass from log p(x) to the sum nodes' values (never into the leaves), so the
trace costs about a forward and a backward of the sum layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .circuit import ProbabilisticCircuit, WeightView, circuit_of
from .flows import downward

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch import nn

    from .circuit import Pass

__all__ = [
    "WeightView",
    "edge_curvature",
    "flows",
    "hessian_trace",
    "node_curvature",
    "node_sums",
    "trace_by_depth",
]


def _inputs(batch) -> torch.Tensor:
    """The inputs of a batch given as x or as (x, y[, ...])."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def flows(
    circuit: ProbabilisticCircuit,
    x: torch.Tensor,
    weights: list[torch.Tensor] | None = None,
    create_graph: bool = False,
) -> tuple[Pass, list[torch.Tensor]]:
    """(the ``Pass`` of x with its local terms, each sum level's per-example node flows
    ∂log p(x)/∂log p_i(x), the root's being 1). ``weights``: as ``evaluate``'s (default: the
    circuit's own). Without ``create_graph`` by the top-down pass (flows.py); with it by
    autograd, the flows then differentiable in the circuit's parameters."""
    if not create_graph:
        with torch.no_grad():
            weights = [w.detach() for w in (circuit.weights() if weights is None else weights)]
            p = circuit.evaluate(x, weights, leaf_grad=False, local=True)
            return p, downward(circuit, p, weights, torch.ones_like(p.ll))[0]
    with torch.enable_grad():
        weights = circuit.weights() if weights is None else weights
        p = circuit.evaluate(x, weights, local=True)
        inner = p.sums[1:]
        f = torch.autograd.grad(p.ll.sum(), inner, create_graph=True) if inner else ()
    return p, [torch.ones_like(p.ll), *f]


def node_sums(
    circuit: ProbabilisticCircuit,
    x: torch.Tensor,
    weights: list[torch.Tensor] | None = None,
    create_graph: bool = False,
    done: tuple[Pass, list[torch.Tensor]] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sum level t: (Σ_x f_i(x)², Σ_x f_i(x)²·s_i(x)) of each node, summed over the batch
    (shapes ``[]`` at the root, ``[R, 2^t, S]`` below). ``done``: ``flows``' result, if made."""
    p, f = done if done is not None else flows(circuit, x, weights, create_graph)
    out = []
    for t in range(circuit.depth):
        f2 = f[t].square()
        pair = (f2.sum(0), (f2 * p.local[t]).sum(0))
        out.append(pair if create_graph else tuple(v.detach() for v in pair))
    return out


def node_curvature(
    model: nn.Module, batches: Iterable, weights: list[torch.Tensor] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sum level t (0 = the root): (φ_i, T_i) of each node over all examples in
    ``batches``: φ_i = mean f_i(x)² (the flow) and T_i = mean f_i(x)²·s_i(x), its share of
    −tr H; T_i / φ_i is the flow-weighted mean local term."""
    circuit, total, n = circuit_of(model), None, 0
    for batch in batches:
        x = _inputs(batch)
        part = node_sums(circuit, x, weights)
        total = part if total is None else [(a + c, b + d) for (a, b), (c, d) in zip(total, part)]
        n += len(x)
    return [(a / n, b / n) for a, b in total]


def trace_by_depth(
    model: nn.Module, batches: Iterable, weights: list[torch.Tensor] | None = None
) -> list[float]:
    """tr H's share of the sum nodes at each depth (0 = the root); they sum to the trace."""
    return [-float(t.sum()) for _, t in node_curvature(model, batches, weights)]


def hessian_trace(
    model: nn.Module, batches: Iterable, weights: list[torch.Tensor] | None = None
) -> float:
    """The exact trace of the Hessian of the mean log-likelihood over ``batches`` (x, or
    (x, y) pairs) with respect to the circuit's sum weights (≤ 0; −trace is the sharpness)."""
    return float(sum(trace_by_depth(model, batches, weights)))


def edge_curvature(
    circuit: ProbabilisticCircuit,
    x: torch.Tensor,
    weights: list[torch.Tensor] | None = None,
    done: tuple[Pass, list[torch.Tensor]] | None = None,
) -> list:
    """Per level, shaped like its weights: h_ij = Σ_x (∂log p(x)/∂w_ij)², summed over the batch
    (−H's diagonal times the batch size; f_i(x)² (c_j(x)/p_i(x))² per example). ``done``:
    ``flows``' result, if made."""
    p, f = done if done is not None else flows(circuit, x, weights)
    products, shift = p.parts[0]  # shifted values: c/p = P·e^shift / e^ll at the root
    root = (f[0].unsqueeze(-1) * torch.exp(shift - p.ll.unsqueeze(-1))).square()  # [B, R]
    out = [torch.einsum("br,brk->rk", root, products.square()).reshape(-1)]
    for t in range(1, circuit.depth):
        products, mixed = p.parts[t]  # c/p = P/mixed below the root
        out.append(torch.einsum("brgs,brgk->rgsk", (f[t] / mixed).square(), products.square()))
    return [e.detach() for e in out]
