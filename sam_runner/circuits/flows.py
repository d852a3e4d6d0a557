"""The circuit's top-down pass: every sum node's flow f_i(x) = ∂log p(x)/∂log p_i(x), every
edge's expected flow n_ij(x) = f_i(x)·w_ij c_j(x)/p_i(x) summed over the batch, and the leaf
units' flows, from one forward's intermediates (``Pass.parts``), without autograd.

Per level, with Q = f/mixed (the parents' flows over their shifted values) and P the products of
the children's shifted values: n = w ⊙ Σ_b Q ⊗ P, and a child unit's flow is its share of
(Q·w) ⊙ P summed over its partner units. Every quantity is weighted by ``root`` (the gradient of
the outputs: 1 gives the flows themselves)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from typing import Any

    from torch import nn


def _children(t: torch.Tensor, products: torch.Tensor, units: int, dim: int) -> torch.Tensor:
    """The two child regions' unit flows from the product flows ``t ⊙ products`` [..., U²]."""
    tp = (t * products).unflatten(-1, (units, units))
    return torch.stack((tp.sum(-1), tp.sum(-2)), dim=dim)


def downward(
    circuit: nn.Module, p: Any, weights: list[torch.Tensor], root: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """A ``ProbabilisticCircuit``'s top-down pass over its ``Pass`` p at ``weights``: (flows:
    the root's ``root`` and each level's ``[B, R, 2^t, S]``; edge statistics
    Σ_b root_b·n_ij(x_b) shaped as each level's weights; the leaf units' flows
    ``[B, R, 2^depth, U]``)."""
    n, reps, units = len(root), circuit.repetitions, circuit.sum_units
    products, shift = p.parts[0]  # [B, R, U²], [B, R]
    q = root.unsqueeze(-1) * torch.exp(shift - p.ll.unsqueeze(-1))  # [B, R]
    w0 = weights[0].view(reps, -1)
    stats = [(w0 * torch.einsum("br,brk->rk", q, products)).reshape(-1)]
    child = _children(q.unsqueeze(-1) * w0, products, units, dim=2)  # [B, R, 2, U]
    flows = [root]
    for t in range(1, circuit.depth):
        flows.append(child)
        products, mixed = p.parts[t]
        q = child / mixed
        stats.append(weights[t] * torch.einsum("brgs,brgk->rgsk", q, products))
        spread = torch.einsum("brgs,rgsk->brgk", q, weights[t])
        child = _children(spread, products, units, dim=3).view(n, reps, 2 ** (t + 1), units)
    return flows, stats, child


def leaf_statistics(circuit: nn.Module, x: torch.Tensor, leaf_flows: torch.Tensor) -> torch.Tensor:
    """``[R, D, U, K]``: Σ_b flow of leaf unit u of x_d's region · [x_d = k], the expected
    counts of each leaf distribution's categories."""
    n, k, parts = len(x), circuit.categories, 2**circuit.depth
    onehot = torch.nn.functional.one_hot(x.reshape(n, -1).long(), k).to(leaf_flows.dtype)
    table = onehot.reshape(n, -1).T @ leaf_flows.reshape(n, -1)  # [(D, K), (R, L, U)]
    table = table.view(circuit.num_vars, k, circuit.repetitions, parts, circuit.sum_units)
    regions = circuit.leaf_index.view(circuit.repetitions, circuit.num_vars) % parts
    where = torch.nn.functional.one_hot(regions, parts).to(leaf_flows.dtype)  # [R, D, L]
    return torch.einsum("dkrlu,rdl->rduk", table, where)
