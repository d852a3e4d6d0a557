"""Mini-batch EM on a circuit's parameters (``base_optimizer=em``).

For a circuit linear in each node's weight vector, the expected flow of the edge i -> j on x is
n_ij(x) = w_ij ∂log p(x)/∂w_ij = ∂log p(x)/∂log w_ij (the posterior probability that an induced
tree of x uses the edge), and the M-step sets w_i ∝ Σ_x n_i(x). The backward pass of the mean
negative log-likelihood gives exactly −(1/B) Σ_x n_ij(x) at the normalised log-weights (the
circuit records it there, circuit.py's hooks), for the sum weights and for the leaves' category
probabilities alike (a categorical leaf is a sum over indicators). A step with the step size η
(``lr``; the scheduler shapes it):

    w ← (1 − η)·w + η·ŵ,   ŵ_ij = (n̄_ij + β_ij + α) / Σ_k (n̄_ik + β_ik + α)

n̄ the batch's mean flows, β the pseudo-counts a regularizer adds (regularizers.py: the closed-
form regularized update), α ``pseudocount``. η = 1 on the whole training set is classic EM;
η < 1 on mini-batches is stepwise EM (Liang & Klein 2009; Peharz et al. 2020).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.optim.optimizer import ParamsT

TINY = 1e-30  # a weight EM sets to 0 is kept at this (its logit stays finite)


class EM(torch.optim.Optimizer):
    """Mini-batch EM on the logits of a circuit's normalised weights; ``step(closure)`` runs the
    closure (forward and backward of the mean negative log-likelihood), then sets every
    parameter to the log of its updated weights.

    Args:
        params: the circuit's parameters (each the logits of distributions over its last axis).
        lr: the step size η in (0, 1].
        pseudocount: α >= 0, added to every edge's expected count.
        weight_decay: accepted for the runner's parameter groups, and unused.
    """

    def __init__(
        self, params: ParamsT, lr: float = 1.0, pseudocount: float = 0.0, weight_decay: float = 0.0
    ) -> None:
        super().__init__(params, dict(lr=lr, pseudocount=pseudocount, weight_decay=weight_decay))
        for group in self.param_groups:
            for p in group["params"]:
                p.em_driven = True  # the circuit records EM's statistic on the backward pass

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One EM step on every parameter a pass reached: its expected counts (plus prior and
        pseudocount) normalised, at step size ``lr``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                grad = getattr(p, "em_grad", None)
                if grad is None:  # no pass reached it
                    continue
                prior = getattr(p, "em_prior", None)
                counts = -grad + (0 if prior is None else prior) + group["pseudocount"]
                p.copy_(torch.log(em_update(p, counts.clamp_min(0), group["lr"])))
                p.em_grad = p.em_prior = None
        return loss


def em_update(logits: torch.Tensor, counts: torch.Tensor, lr: float) -> torch.Tensor:
    """(1 − η)·softmax(logits) + η·counts normalised over the last axis (a node without counts
    keeps its weights), floored at ``TINY``."""
    old = torch.softmax(logits, dim=-1)
    total = counts.sum(-1, keepdim=True)
    new = torch.where(total > 0, counts / total.clamp_min(TINY), old)
    return ((1 - lr) * old + lr * new).clamp_min(TINY)
