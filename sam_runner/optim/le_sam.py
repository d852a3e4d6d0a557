"""LE-SAM (Loss-Equated SAM; known from its abstract).

A fixed loss-space budget σ instead of a fixed radius: ε = σ g / (‖g‖² + δ), so that the
predicted rise ⟨g, ε⟩ = σ ‖g‖² / (‖g‖² + δ) ≈ σ, with ‖ε‖ capped at ρ_max (ε is then
rescaled to norm ρ_max). Defaults σ = 0.01, ρ_max = 1.0, δ = 1e-12;
``sigma_schedule`` 'constant' or 'cosine' (σ decays to 0 over ``total_steps``).

From the abstract: a fixed loss-space budget replaces SAM's fixed radius. Ours
(docs/variants.md): the first-order budget rule, the cap and the schedule. LE-SAM has
no fixed radius: the runner refuses ``optimizer.rho`` for it (``rho_refused``), and
``rho_schedule`` must stay 'constant' (there is no radius to schedule; ``sigma_schedule``
decays the budget instead). ``log_values`` reports as ``rho`` the radius ‖ε‖ of the last
perturbation (and ``sigma``, the budget of the current step).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import SharpnessAware, _check, cosine_factor

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT

SIGMA_SCHEDULES = ("constant", "cosine")


@VARIANTS.register(
    "le_sam", "a loss budget σ instead of a radius: ε = σ g/(‖g‖² + δ), ‖ε‖ ≤ ρ_max (LE-SAM)"
)
class LESAM(SharpnessAware):
    variant_options = {"sigma": 0.01, "rho_max": 1.0, "sigma_schedule": "constant", "delta": 1e-12}
    has_rho = False
    rho_refused = (
        "it has no fixed radius: set optimizer.sigma (the loss budget) or optimizer.rho_max (the "
        "cap on ||eps||)"
    )

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            self.sigma >= 0 and math.isfinite(self.sigma),
            f"sigma must be a finite number >= 0, got {self.sigma}",
        )
        _check(self.rho_max > 0, f"rho_max must be > 0, got {self.rho_max}")
        _check(
            self.rho_schedule == "constant",
            f"rho_schedule={self.rho_schedule!r} does not apply (LE-SAM has no radius to "
            "schedule); set sigma_schedule='cosine' to decay the loss budget",
        )
        _check(
            self.sigma_schedule in SIGMA_SCHEDULES,
            f"sigma_schedule must be one of {SIGMA_SCHEDULES}, got {self.sigma_schedule!r}",
        )
        _check(
            self.sigma_schedule != "cosine" or (self.total_steps or 0) > 0,
            "sigma_schedule='cosine' needs total_steps > 0",
        )
        self.eps_norm = None  # ‖ε‖ of the last perturbation (device tensor)

    @property
    def current_sigma(self) -> float:
        """σ of the current step under ``sigma_schedule``."""
        if self.sigma_schedule == "cosine":
            return self.sigma * cosine_factor(self.step_count, self.total_steps)
        return self.sigma

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = σ g / (‖g‖² + δ), its norm capped at ρ_max."""
        n = self.g_norm
        # σ / (‖g‖² + δ), or ρ_max / ‖g‖ when that would make ‖ε‖ exceed ρ_max
        scale = torch.minimum(
            self.current_sigma / (n.square() + self.delta), self.rho_max / (n + 1e-12)
        )
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, scale)
        self.eps_norm = scale * n

    def log_values(self) -> dict:
        """σ, the largest first-pass ‖g‖ and the last step's ‖ε‖ (as ``rho``)."""
        out = {"sigma": self.current_sigma, **self.pop_grad_norm_max()}
        if self.eps_norm is not None:
            out["rho"] = float(self.eps_norm)
        return out
