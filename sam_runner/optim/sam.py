"""SAM (Foret et al., 2021): ε = ρ g / ‖g‖, one global norm over all parameters.

``self.g_norm`` is ‖g‖, computed once by the engine before ``compute_perturbation``.

SAM itself needs ε only to move θ, and the first-pass gradients only to build ε (the second
pass's closure replaces them): it scales them in place and adds them, one pass over the
parameters fewer than writing ε first (the same products, so the same bits). A subclass with its
own ``compute_perturbation`` takes the engine's way, with ε in its buffers.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import SharpnessAware


@VARIANTS.register("sam", "ε = ρ g/‖g‖ (Foret et al. 2021)")
class SAM(SharpnessAware):
    def _scale(self):
        return self.current_rho / (self.g_norm + 1e-12)

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ g / ‖g‖."""
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, self._scale())

    @override
    def perturb_(self, params: list[torch.Tensor], pgrads: list[torch.Tensor]) -> None:
        """θ ← θ + ε with ε built in the gradients' own storage (the engine's way under a filter
        or another rule)."""
        # a subclass's own rule, or a filter on ε (a federated algorithm's): the engine's way
        own_rule = type(self).compute_perturbation is SAM.compute_perturbation
        if self._perturbation_filters or not own_rule:
            return super().perturb_(params, pgrads)
        torch._foreach_mul_(pgrads, self._scale())  # ε, in the gradients' own storage
        self.save_theta(params)
        torch._foreach_add_(params, pgrads)
