"""No perturbation: one pass and the base optimizer's step (the baseline of every study)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..registry import VARIANTS
from .engine import SharpnessAware

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import torch
    from torch.optim.optimizer import ParamsT


@VARIANTS.register("base", "no perturbation: one pass and the base optimizer's step (the baseline)")
class Base(SharpnessAware):
    passes = 1
    has_rho = False  # a swept optimizer.rho is accepted and ignored (see __init__)
    # nothing is perturbed: the engine's perturbation options change nothing
    ignored_options = (
        "rho",
        "rho_schedule",
        "interval",
        "perturb_schedule",
        "perturb_prob",
        "perturb_from",
        "perturb_delta",
        "perturb_lambda1",
        "perturb_lambda2",
        "perturb_seed",
        "sync_perturbation",
        "perturb_with_weight_decay",
    )

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float | None = None,
        **kwargs: Any,
    ) -> None:
        # rho (None or a number) is ignored, not an error: the study presets sweep base beside
        # SAM variants under one optimizer.rho
        del rho
        super().__init__(params, base_optimizer, **kwargs)

    def log_values(self) -> dict:
        """The largest first-pass ‖g‖ since the last line (no ρ: nothing is perturbed)."""
        return self.pop_grad_norm_max()  # no ρ: nothing is perturbed
