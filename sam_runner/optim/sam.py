"""SAM (Foret et al., 2021): ε = ρ g / ‖g‖, one global norm over all parameters."""
import torch

from .engine import SharpnessAware


class SAM(SharpnessAware):
    def compute_perturbation(self, params, grads, eps):
        scale = self.current_rho / (self.global_norm(grads) + 1e-12)
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, scale)
