"""GSAM (Zhuang et al., 2022, "Surrogate Gap Guided Sharpness-Aware Minimization").

ε = ρ g / ‖g‖ as in SAM; the descent direction is ∇L(θ+ε) − α g⊥, g⊥ the component of
the first-pass gradient g orthogonal to ∇L(θ+ε). Default α = 0.1.

ρ follows the learning rate: ``rho_schedule='lr'`` by default (overridable), i.e.
ρ_k = ρ · η_k / η₀, η₀ the learning rate the optimizer was built with (the runner builds it
before the scheduler, so η₀ is ``base_optimizer.lr``, the peak of a warmup-and-decay
schedule). That is a line through the origin. The paper ties ρ to the learning rate by a
line between (lr_min, ρ_min) and (lr_max, ρ_max); the two agree when ρ_min / ρ_max =
lr_min / lr_max, e.g. ρ_min = 0 for a learning rate decaying to 0. A separate ρ_min is not
offered here (ours).

The paper's algorithm otherwise, with one more choice of ours: under data parallelism
without ``sync_perturbation``, g is averaged across processes before the decomposition so
that every process applies the same direction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register(
    "gsam", "descent ∇L(θ+ε) − α g⊥, ρ following the lr schedule (Zhuang et al. 2022)"
)
class GSAM(SAM):
    variant_options = {"alpha": 0.1}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho_schedule: str = "lr",
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho_schedule=rho_schedule, **kwargs)
        _check(self.alpha >= 0, f"alpha must be >= 0, got {self.alpha}")
        self._own_g = None  # sharded, each process's own ε: the mean first-pass g, as shards

    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """SAM's ε = ρ g/‖g‖, with g kept for the descent's correction."""
        c = self._cache
        if self._gathered is not None:  # sharded, each process's own g: the mean's shards
            self._own_g = self.shards_of_mean(self._lists()[1]) if self.alpha else None
        else:
            if "g" not in c:
                c["g"] = [torch.empty_like(p) for p in params]
            # the first-pass gradient, kept for the descent
            torch._foreach_copy_(c["g"], self._lists()[1])
        super().compute_perturbation(params, grads, eps)

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """The descent gradient ∇L(θ+ε) − α g⊥, g⊥ the part of g orthogonal to it."""
        if self.alpha == 0:
            return
        g, gp, own, self._own_g = self._cache.get("g"), self._lists()[1], self._own_g, None
        if own is not None:  # already the mean over the processes (shards_of_mean)
            g = own
        elif not self.sync_perturbation:  # g is this process's own: one direction everywhere
            self.all_reduce_mean_list_(g)
        # g⊥ = g − (⟨g, gp⟩ / ‖gp‖²) gp;  gp − α g⊥ = (1 + α ⟨g, gp⟩ / ‖gp‖²) gp − α g
        coef = self.dot(g, gp) / (self.global_norm(gp).square() + 1e-12)
        torch._foreach_mul_(gp, 1 + self.alpha * coef)
        torch._foreach_add_(gp, g, alpha=-self.alpha)
