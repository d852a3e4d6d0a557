"""No perturbation: one pass and the base optimizer's step (the baseline of every study)."""

from ..registry import VARIANTS
from .engine import SharpnessAware


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

    def __init__(self, params, base_optimizer, rho=None, **kwargs):
        # rho (None or a number) is ignored, not an error: the study presets sweep base beside
        # SAM variants under one optimizer.rho
        del rho
        super().__init__(params, base_optimizer, **kwargs)

    def log_values(self):
        return self.pop_grad_norm_max()  # no ρ: nothing is perturbed
