"""SAM-SPS (SAM with stochastic Polyak step sizes; known from its abstract and public reference
code).

Perturbed point e = θ + ρ (1 − λ + λ / ‖g‖) g (λ = 1 is SAM, λ = 0 unnormalised SAM).
Step size γ = clip((L(e) − ℓ* − ⟨∇L(e), e − θ⟩) / ‖∇L(e)‖², 0, γ_max); update
θ ← θ − γ (∇L(e) + wd θ). Defaults ρ = 0.1, λ = ``lam`` = 1, ℓ* = ``loss_floor`` = 0,
γ_max = ``gamma_max`` = 1; wd is the SGD base's ``weight_decay``, 5e-4 unless given.

γ replaces the learning rate, so the base optimizer must be plain ``torch.optim.SGD``
with momentum 0 (our choice: the formula is a plain step; anything else is rejected);
its ``lr`` and any learning-rate schedule are unused. ``conf/optimizer/sam_sps.yaml``
sets ``base_optimizer.momentum: 0``. On steps that do not perturb (``interval`` > 1)
e = θ and γ = clip((L(θ) − ℓ*) / ‖g‖², 0, γ_max). Gradient clipping, when set, applies
to ∇L(e) before γ is computed. Under data parallelism the numerator is averaged across
processes so that every process takes the same step. ``log_values`` reports γ as ``sps_step``.
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


@VARIANTS.register("sam_sps", "SAM with a Polyak step size in place of the learning rate (SAM-SPS)")
class SAMSPS(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its step size reads ⟨∇L(θ + ε), ε⟩: each process's whole ε against the sharded gradient"
    )
    step_needs_losses = True  # first_step/second_step take loss= (L(θ), L(θ+ε))
    variant_options = {"lam": 1.0, "loss_floor": 0.0, "gamma_max": 1.0}
    replaces_lr = True

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.1,
        **kwargs: Any,
    ) -> None:
        _check(
            isinstance(base_optimizer, type) and issubclass(base_optimizer, torch.optim.SGD),
            "SAMSPS replaces the learning rate with a Polyak step, so base_optimizer must be "
            "torch.optim.SGD (base_optimizer=sgd), got "
            f"{getattr(base_optimizer, '__name__', base_optimizer)}",
        )
        kwargs.setdefault("weight_decay", 5e-4)  # our default wd (SGD's own default is 0)
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        bad = {
            (g["momentum"], g["nesterov"])
            for g in self.param_groups
            if g["momentum"] or g["nesterov"]
        }
        _check(
            not bad,
            "SAMSPS takes a plain SGD step: base momentum must be 0 and nesterov false, got "
            f"(momentum, nesterov) in {sorted(bad)}",
        )
        _check(0 <= self.lam <= 1, f"lam must be in [0, 1], got {self.lam}")
        _check(self.gamma_max > 0, f"gamma_max must be > 0, got {self.gamma_max}")
        self.sps_step = None  # γ of the last step (device tensor)

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ (1 − λ + λ / ‖g‖) g."""
        scale = self.current_rho * (1 - self.lam + self.lam / (self.g_norm + 1e-12))
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, scale)

    def base_step(self) -> None:
        """θ ← θ − γ (∇L(e) + wd θ) with the clipped stochastic Polyak step γ."""
        params, grads, slices = self._lists()
        num = self.descent_loss.detach() - self.loss_floor  # in the run's dtype (float64 stays so)
        if self.last_perturbed:
            num = num - self.dot(grads, self._cache["eps"])  # − ⟨∇L(e), e − θ⟩
        num = self.all_reduce_mean_(num)
        gamma = (num / (self.global_norm(grads).square() + 1e-12)).clamp(0, self.gamma_max)
        # ε is spent: its buffers hold the step, the gradients stay untouched
        step = self._cache["eps"]
        torch._foreach_copy_(step, grads)
        for (a, b), group in zip(slices, self.param_groups):  # ∇L(e) + wd θ, one foreach per group
            if b > a and group["weight_decay"]:
                torch._foreach_add_(step[a:b], params[a:b], alpha=group["weight_decay"])
        torch._foreach_mul_(step, gamma)
        torch._foreach_sub_(params, step)
        self.sps_step = gamma

    def log_values(self) -> dict:
        """The engine's values and the last Polyak step (``sps_step``)."""
        out = super().log_values()
        if self.sps_step is not None:
            out["sps_step"] = float(self.sps_step)
        return out
