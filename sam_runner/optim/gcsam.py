"""GCSAM, gradient-centralized SAM (Hassan et al. 2025, arXiv 2501.11584; pytorch_optimizer's
``SAM(use_gc=True)``).

Gradient centralization GC(g): from every gradient tensor with more than one dimension (conv
and linear weights) the mean over all its dimensions but the first (per output channel) is
subtracted; vectors (biases, normalisation weights) stay. The paper: ε = ρ GC(g̃)/‖GC(g̃)‖ and
the descent with GC(∇L(θ+ε)).

``gc_norm``: ``centralized`` (the paper) or ``raw``: ε = ρ GC(g̃)/‖g̃‖, the norm of the gradient
before centralization, as pytorch_optimizer computes it. ``gc_descent``: true (the paper)
centralizes the descent gradient too; false leaves it (pytorch_optimizer). With
``gc_norm=raw, gc_descent=false`` the step is pytorch_optimizer's ``SAM(use_gc=True)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from torch.optim.optimizer import ParamsT

GC_NORMS = ("centralized", "raw")


def centralize_(tensors: Iterable[torch.Tensor]) -> None:
    """GC in place: subtract, from each tensor of two or more dimensions, its mean per output
    channel (over every dimension but the first)."""
    for t in tensors:
        if t.ndim > 1:
            t.sub_(t.mean(dim=tuple(range(1, t.ndim)), keepdim=True))


@VARIANTS.register("gcsam", "SAM on centralized gradients: ε and descent with GC(g) (GCSAM)")
class GCSAM(SAM):
    variant_options = {"gc_norm": "centralized", "gc_descent": True}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            self.gc_norm in GC_NORMS,
            f"gc_norm must be one of {GC_NORMS}, got {self.gc_norm!r}",
        )
        self.gc_descent = bool(self.gc_descent)

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ GC(g)/‖·‖, the norm of GC(g) or of g (``gc_norm``)."""
        torch._foreach_copy_(eps, grads)
        centralize_(eps)
        norm = self.global_norm(eps) if self.gc_norm == "centralized" else self.g_norm
        torch._foreach_mul_(eps, self.current_rho / (norm + 1e-12))

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Centralize the descent gradient too with ``gc_descent``."""
        if self.gc_descent:
            centralize_(self._lists()[1])
