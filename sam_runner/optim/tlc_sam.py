"""TLC-SAM (Taylor-Locality Controlled SAM; known from its abstract).

SAM's ε = ρ g / ‖g‖ with ρ adjusted from the observed Taylor-approximation error. Both
passes already give L(θ) and L(θ+ε); the first-order prediction of the rise is ⟨g, ε⟩
(= ρ‖g‖ for SAM's ε). Taylor error τ = |L(θ+ε) − L(θ) − ⟨g, ε⟩| / (|⟨g, ε⟩| + δ); EMA
τ̄ ← β τ̄ + (1 − β) τ (β = 0.9); ρ ← clip(ρ · exp(κ (τ* − τ̄)), ρ_min, ρ_max) after every
perturbing step: ρ grows while the linearisation holds and shrinks when it breaks.
Defaults τ* = 0.2, κ = 0.05, ρ_min = 0.01, ρ_max = 0.5, δ = 1e-12, initial ρ = ``rho``.

The ``rho`` that ``log_values`` reports (and metrics.jsonl records) is the controller's ρ after
its last update, i.e. the ρ the *next* perturbing step will use, not the one the last step
used; ``tau_bar`` is likewise τ̄ after the last step.

From the abstract: adjusting ρ from the observed Taylor-approximation error. Ours
(docs/variants.md): the error measure, the multiplicative controller and its defaults;
also ours: τ̄ starts at the first τ of a step the fp16 scaler does not skip (no zero
bias), ρ and τ̄ live on the device (no host sync), under data parallelism τ is averaged
across processes so every process keeps the same ρ, and ``rho_schedule`` must be 'constant' (the
controller owns ρ).
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


@VARIANTS.register("tlc_sam", "ρ steered by the observed Taylor error of the loss rise (TLC-SAM)")
class TLCSAM(SharpnessAware):
    step_needs_losses = True  # first_step/second_step take loss= (L(θ), L(θ+ε))
    variant_options = {
        "tau_target": 0.2,
        "kappa": 0.05,
        "rho_min": 0.01,
        "rho_max": 0.5,
        "tau_beta": 0.9,
        "delta": 1e-12,
    }

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.05,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(
            0 < self.rho_min <= self.rho_max,
            f"need 0 < rho_min <= rho_max, got rho_min={self.rho_min}, rho_max={self.rho_max}",
        )
        _check(
            self.rho_min <= self.rho <= self.rho_max,
            f"rho={self.rho} must lie in [rho_min, rho_max] = [{self.rho_min}, {self.rho_max}]",
        )
        _check(
            self.rho_schedule == "constant",
            "TLCSAM controls rho itself: rho_schedule must be 'constant', got "
            f"{self.rho_schedule!r}",
        )
        _check(
            self.kappa >= 0 and math.isfinite(self.kappa),
            f"kappa must be a finite number >= 0, got {self.kappa}",
        )
        _check(0 <= self.tau_beta < 1, f"tau_beta must be in [0, 1), got {self.tau_beta}")
        self.rho_t = None  # the controlled ρ (device tensor)
        self.tau_bar = None  # τ̄ (device tensor)
        self.tau_set = None  # whether τ̄ holds a real τ yet (device bool)
        self._predicted = None

    @property
    def current_rho(self) -> float:
        """The controlled ρ as a float (a host sync: for logging, not for the step): after a
        step, the ρ the next perturbing step will use (the controller has already moved it)."""
        return float(self.rho_t) if self.rho_t is not None else self.rho

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ_t g/‖g‖ with the controlled radius ρ_t."""
        if self.rho_t is None:
            # controller state in float64
            self.rho_t = torch.tensor(self.rho, dtype=torch.float64, device=grads[0].device)
        scale = self.rho_t / (self.g_norm + 1e-12)
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, scale)
        if self.perturb_with_weight_decay:  # ε is built from g + wd θ: ⟨g, ε⟩ in full
            self._predicted = self.dot(self._lists()[1], eps)
        else:
            # ⟨g, ε⟩ = ρ‖g‖
            self._predicted = self.rho_t * self.g_norm.square() / (self.g_norm + 1e-12)

    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """The Taylor error τ of this step into its EMA τ̄, and ρ_t moved towards τ*."""
        pred = self._predicted
        tau = (perturbed_loss.detach() - loss.detach() - pred).abs() / (pred.abs() + self.delta)
        tau = self.all_reduce_mean_(tau.double())
        if self.tau_bar is None:
            self.tau_bar, self.tau_set = (
                torch.zeros_like(tau),
                torch.zeros_like(tau, dtype=torch.bool),
            )
        # τ̄ starts at the first τ of a step that is not skipped (a device flag: no host sync)
        tau_bar = torch.where(
            self.tau_set, self.tau_beta * self.tau_bar + (1 - self.tau_beta) * tau, tau
        )
        rho = (self.rho_t * torch.exp(self.kappa * (self.tau_target - tau_bar))).clamp(
            self.rho_min, self.rho_max
        )
        # a skipped fp16 step (inf/NaN) leaves the controller as it was
        self.tau_bar = self.keep_if_overflow(tau_bar, self.tau_bar)
        self.tau_set = self.keep_if_overflow(torch.ones_like(self.tau_set), self.tau_set)
        self.rho_t = self.keep_if_overflow(rho, self.rho_t)

    def log_values(self) -> dict:
        """The engine's values and the Taylor error's EMA ``tau_bar``."""
        out = super().log_values()
        if self.tau_bar is not None and bool(self.tau_set):  # log-time host sync
            out["tau_bar"] = float(self.tau_bar)
        return out

    def variant_state(self) -> dict:
        """The engine's state, ρ_t and the Taylor error's EMA."""
        return {
            **super().variant_state(),
            "rho_t": self.rho_t,
            "tau_bar": self.tau_bar,
            "tau_set": self.tau_set,
        }

    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        for key in ("rho_t", "tau_bar", "tau_set"):
            value = state.get(key)
            setattr(self, key, value.clone() if value is not None else None)
        if self.tau_bar is not None and self.tau_set is None:  # a checkpoint from before the flag
            self.tau_set = torch.ones_like(self.tau_bar, dtype=torch.bool)
