"""SAMPLe (Sharpness-Aware Minimization for Prompt Learning; known from its abstract alone): SAM
whose radius is set at every step so that the perturbed loss meets a budget.

The abstract: a sharpness-aware optimizer that works "by satisfying objective function
constraints at each step, dynamically adapting to the current optimization state based on the
local curvature and gradient properties". Our formulation (docs/fine_tuning.md#sample), all of it
ours where the abstract is silent: ε = ρ_t g/‖g‖ as in SAM, with ρ_t chosen so that the rise the
local quadratic model predicts, L(θ + ε) − L(θ) ≈ ρ‖g‖ + ½κρ², equals the budget δ = ``budget``:

    ρ_t = min(ρ_max, 2δ / (‖g‖ + √(‖g‖² + 2κδ)))

(the positive root, in the form that does not cancel), ρ_max = ``rho`` under ``rho_schedule``; where
the model's rise never reaches δ (κ < 0 and ‖g‖² + 2κδ < 0) ρ_t = ρ_max. κ is the curvature along
the gradient, measured by the two passes of the steps before: each perturbing step gives
κ̂ = 2(L(θ + ε) − L(θ) − ρ_t‖g‖)/ρ_t² (exact on a quadratic), and κ = an EMA of κ̂ (β =
``curvature_decay`` = 0.9; 0 before the first step, so the first ρ is first-order, δ/‖g‖).
With a budget that does not bind (δ ≥ ρ_max‖g‖ + ½κρ_max²) a step is SAM's with ρ = ρ_max.

No host sync (but fp16's: a step the scaler skips leaves κ unchanged): ρ_t and κ stay on the
device. κ̂ is averaged over data-parallel processes (one scalar all-reduce), so every process
keeps the same κ; ρ_t uses the process's own ‖g‖, as SAM's ε does. ``log_values`` reports the
last ρ_t as ``rho``, κ as ``sample_curvature`` and the last measured rise as ``sample_rise``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import SharpnessAware, _check

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register(
    "sample", "SAM with ρ set each step so the perturbed loss meets a budget (SAMPLe, ours)"
)
class SAMPLe(SharpnessAware):
    step_needs_losses = True  # first_step/second_step take loss= (L(θ), L(θ+ε))
    variant_options = {"budget": 0.05, "curvature_decay": 0.9}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        budget = self.budget
        _check(
            not isinstance(budget, bool)
            and isinstance(budget, (int, float))
            and 0 < budget < math.inf,
            f"budget={budget!r} must be a finite number > 0 (the rise of the loss allowed at the "
            "perturbed point)",
        )
        _check(
            0 <= self.curvature_decay < 1,
            f"curvature_decay must be in [0, 1), got {self.curvature_decay}",
        )
        self.budget = float(budget)
        self.curvature = None  # κ (device scalar), after the first perturbing step
        self.step_rho = None  # ρ_t of the last perturbing step (device scalar)
        self.rise = None  # its L(θ + ε) − L(θ)

    def radius(self, g_norm: torch.Tensor) -> torch.Tensor:
        """ρ_t for this step's ‖g‖ (a device scalar)."""
        cap = torch.full_like(g_norm, self.current_rho)
        if self.curvature is None:
            return torch.minimum(cap, self.budget / (g_norm + 1e-12))
        disc = g_norm.square() + 2 * self.curvature.to(g_norm) * self.budget
        root = 2 * self.budget / (g_norm + disc.clamp_min(0).sqrt() + 1e-12)
        return torch.where(disc < 0, cap, torch.minimum(cap, root))

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ_t g/‖g‖ with this step's radius ``radius(‖g‖)``."""
        self.step_rho = self.radius(self.g_norm)
        self._step_g_norm = self.g_norm
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, self.step_rho / (self.g_norm + 1e-12))

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Update the curvature estimate κ from the measured rise, unless the fp16 step was
        skipped."""
        if self.overflowed():  # fp16 only (a host sync there): a skipped step leaves κ
            return
        rho, g_norm = self.step_rho, self._step_g_norm
        rise = (perturbed_loss.detach() - loss.detach()).to(rho)
        measured = 2 * (rise - rho * g_norm) / rho.square().clamp_min(1e-30)
        measured = self.all_reduce_mean_(measured)  # one κ on every process
        measured = torch.where(rho > 0, measured, torch.zeros_like(measured))
        if self.curvature is not None:  # κ ← β κ + (1 − β) κ̂
            measured = torch.lerp(measured, self.curvature.to(measured), self.curvature_decay)
        self.curvature, self.rise = measured, rise

    def log_values(self) -> dict:
        """The step's ρ, κ and the rise of the perturbed loss, and the largest first-pass ‖g‖."""
        out = {"rho": self.current_rho, **self.pop_grad_norm_max()}
        if self.step_rho is not None:
            out["rho"] = float(self.step_rho)
            out["sample_curvature"] = float(self.curvature)
            out["sample_rise"] = float(self.rise)
        return out

    def variant_state(self) -> dict:
        """The engine's state and the curvature estimate κ."""
        state = super().variant_state()
        if self.curvature is not None:
            state["curvature"] = self.curvature.detach().clone()
        return state

    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        self.curvature = state.get("curvature")
