"""Lion and the Lion-K family (Chen et al. 2023; Chen, Liang, Liu et al. 2023).

Per parameter x with momentum m and gradient g, at learning rate η and decoupled weight decay λ:

    x ← x − η(∇K(β₁m + (1−β₁)g) + λx),    m ← β₂m + (1−β₂)g

K is a convex function: ``l1`` (∇K = sign, which is Lion), ``l2`` (∇K(u) = u/‖u‖ over the
whole tensor; 0 where u = 0) or ``huber`` (∇K(u) = clip(u/δ, −1, 1), elementwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.optim.optimizer import ParamsT

KS = ("l1", "l2", "huber")


def grad_k(u: torch.Tensor, k: str, delta: float) -> torch.Tensor:
    """∇K(u) for the family member ``k``."""
    if k == "l1":
        return torch.sign(u)
    if k == "l2":
        norm = torch.linalg.vector_norm(u)
        return u / norm if norm > 0 else torch.zeros_like(u)
    return torch.clamp(u / delta, -1.0, 1.0)


class LionK(torch.optim.Optimizer):
    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        k: str = "l1",
        delta: float = 1.0,
    ) -> None:
        if k not in KS:
            raise ValueError(f"k={k!r} is unknown; choose {', '.join(KS)}")
        if not lr > 0:
            raise ValueError(f"lr={lr!r} must be > 0")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas={tuple(betas)!r} must be two numbers in [0, 1)")
        if not delta > 0:
            raise ValueError(f"delta={delta!r} must be > 0")
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, k=k, delta=delta)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One Lion-K step on every parameter with a gradient (``closure``: the loss, optional)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["exp_avg"]
                direction = grad_k(m * beta1 + p.grad * (1 - beta1), group["k"], group["delta"])
                p.mul_(1 - lr * wd)  # λx at the current x, as in the update above
                p.add_(direction, alpha=-lr)
                m.lerp_(p.grad, 1 - beta2)
        return loss


class Lion(LionK):
    """Lion: the ``l1`` member of the family (the sign of the interpolated momentum)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, k="l1")
