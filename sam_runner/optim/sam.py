"""SAM (Foret et al., 2021): ε = ρ g / ‖g‖, one global norm over all parameters.

``self.g_norm`` is ‖g‖, computed once by the engine before ``compute_perturbation``.
"""

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import SharpnessAware


@VARIANTS.register("sam", "ε = ρ g/‖g‖ (Foret et al. 2021)")
class SAM(SharpnessAware):
    @override
    def compute_perturbation(self, params, grads, eps):
        scale = self.current_rho / (self.g_norm + 1e-12)
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, scale)
