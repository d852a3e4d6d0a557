"""No perturbation: one pass and the base optimizer's step (the baseline of every study)."""
from .engine import SharpnessAware


class Base(SharpnessAware):
    passes = 1

    def log_values(self):
        return self.pop_grad_norm_max()  # no ρ: nothing is perturbed
