"""EISAM (Extragradient-Inspired SAM; known from its abstract). Three passes per step.

Prediction θ̃ = θ − γ g (γ = ``predict_lr``, default the current learning rate of each
parameter group); the second pass at θ̃ gives ĝ; ε = ρ ĝ / ‖ĝ‖; the third pass at θ̃ + ε
gives the descent gradient, which the base optimizer applies at θ.

From the abstract: a prediction step that probes the landscape, then a perturbation step
whose gradient the base optimizer applies. Ours (docs/variants.md): the prediction as
one plain gradient step, ε built from the predicted point's gradient, and γ's default.
The prediction and ε use the gradient without weight decay (with it when
``perturb_with_weight_decay``). BatchNorm running statistics come from the first pass only.
``pass_index`` is 0, 1, 2; under data parallelism the first two passes synchronise only
when ``sync_perturbation``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register("eisam", "extragradient: ε from the gradient at θ − ηg; three passes (EISAM)")
class EISAM(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its second pass, at the prediction θ − γ g from each process's own g, is not built on "
        "FSDP2's gathered parameters"
    )
    passes = 3
    variant_options = {"predict_lr": None}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            self.predict_lr is None or float(self.predict_lr) >= 0,
            "predict_lr must be null (the current learning rate) or a number >= 0, got "
            f"{self.predict_lr}",
        )

    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Three passes: at θ, at the prediction θ̃ = θ − γ g, and at θ̃ + ε (the descent
        gradient)."""
        loss, params, g = self.first_pass(closure)
        c, slices = self._cache, self._lists()[2]
        torch._foreach_copy_(c["theta"], params)
        for (a, b), group in zip(slices, self.param_groups):  # θ̃ = θ − γ g, one foreach per group
            lr = group["lr"] if self.predict_lr is None else float(self.predict_lr)
            if b > a and lr:
                torch._foreach_add_(params[a:b], g[a:b], alpha=-lr)
        self.run_pass(closure, 1, sync=self.sync_perturbation)
        params, grads, _ = self._lists()
        self._unscale(grads)
        g_hat = self.perturbation_grads(params, grads)
        self.g_norm = self.global_norm(g_hat)
        self.perturbation_into(params, g_hat, c["eps"])  # ε = ρ ĝ / ‖ĝ‖
        torch._foreach_add_(params, c["eps"])  # θ̃ + ε
        self.descend(closure, 2, loss)
        return loss
