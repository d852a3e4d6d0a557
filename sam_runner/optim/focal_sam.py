"""Focal-SAM (Li et al., ICML 2025, "Focal-SAM: Focal Sharpness-Aware Minimization for
Long-Tailed Classification"; official code scongl/Focal-SAM ``focal_sam.py``, ``train_step.py``).

Each class y gets a sharpness weight c_y = λ (1 − n_y/N)^γ, n_y its count in the training set
(N the total): rare classes are flattened more. The objective, per sample i of the batch,
(1 − c_{y_i}) ℓ_i(θ) + c_{y_i} ℓ_i(θ + ε), ε = ρ g_c/‖g_c‖ with g_c = ∇ (1/B) Σ c_{y_i} ℓ_i(θ).
The descent gradient is g_1 + g_s, g_1 = ∇ (1/B) Σ (1 − c_{y_i}) ℓ_i(θ) and
g_s = ∇ (1/B) Σ c_{y_i} ℓ_i(θ + ε). Defaults ρ = 0.2, γ = ``focal_gamma`` = 3, λ = ``sharpness``
= 0.5 (the official CIFAR-10-LT ResNet script).

Three closure calls a step: pass 0 at θ weighted by c (g_c, ε), pass 1 at θ weighted by 1 − c
(g_1), pass 2 at θ + ε weighted by c (g_s). The official code runs one forward at θ and two
backward passes through it (a retained graph): about 2⅔ passes where ours counts 3. The
weights reach the loss through ``reduce_loss(per_sample_loss, logits, targets)``: a training
loop of its own must compute its loss with it (the runner's loop does); a closure that does not
is refused. ``class_counts``: the training set's count per class (the runner passes the
dataset's); null: every class weighs the same, c = λ (1 − 1/C)^γ with C the number of logits.
Under data parallelism pass 0 is unsynchronised unless ``sync_perturbation`` (ε per process, as
in SAM), passes 1 and 2 are synchronised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..losses import token_pairs
from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register(
    "focal_sam", "per-class sharpness weights λ(1 − n_y/N)^γ: flatter tails (Focal-SAM)"
)
class FocalSAM(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its pass at θ between ε and θ + ε is not built on FSDP2's gathered parameters"
    )
    passes = 3
    variant_options = {"focal_gamma": 3.0, "sharpness": 0.5, "class_counts": None}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.2,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(
            self.perturb_schedule != "adaptive",
            "perturb_schedule='adaptive' does not apply to focal_sam (its first pass is weighted "
            "before the decision); use every, random or late",
        )
        _check(self.focal_gamma >= 0, f"focal_gamma must be >= 0, got {self.focal_gamma}")
        _check(0 <= self.sharpness <= 1, f"sharpness must be in [0, 1], got {self.sharpness}")
        if self.class_counts is not None:
            self.set_class_counts(self.class_counts)
        self._weights = None
        self._weighted = False

    def set_class_counts(self, counts: Iterable[float]) -> None:
        """The training set's count per class (a sequence of numbers >= 0, not all 0)."""
        counts = [float(n) for n in counts]
        _check(
            counts and min(counts) >= 0 and sum(counts) > 0,
            f"class_counts must be counts >= 0 with a positive sum, got {counts}",
        )
        self.class_counts = counts
        self._weights = None

    def class_weights(self, num_classes: int, device: torch.device) -> torch.Tensor:
        """c_y = λ (1 − n_y/N)^γ per class (cached on the logits' device)."""
        w = self._weights
        if w is None or w.device != device or len(w) != num_classes:
            if self.class_counts is None:
                freq = torch.full((num_classes,), 1.0 / num_classes, dtype=torch.float64)
            else:
                counts = torch.tensor(self.class_counts, dtype=torch.float64)
                _check(
                    len(counts) == num_classes,
                    f"class_counts has {len(counts)} classes, the logits {num_classes}",
                )
                freq = counts / counts.sum()
            w = self.sharpness * (1 - freq) ** self.focal_gamma
            self._weights = w = w.to(device)
        return w

    @override
    def reduce_loss(
        self, per_sample_loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """The pass's class-weighted mean loss: c_y ℓ in the first pass and the descent pass, (1
        − c_y) ℓ in the second pass at θ; the plain mean on a plain step."""
        self._weighted = True
        if not self.last_perturbed:  # a plain step (perturb_schedule): the plain loss
            return per_sample_loss.mean()
        _, labels = token_pairs(logits, targets)  # a sequence model's: one label a token
        c = self.class_weights(logits.shape[-1], per_sample_loss.device)[labels]
        c = c.view(len(per_sample_loss), -1).mean(dim=1)  # a window's: its tokens' mean (ours)
        weight = 1 - c if self.pass_index == 1 else c
        return (per_sample_loss * weight.to(per_sample_loss.dtype)).mean()

    @override
    def run_pass(
        self,
        closure: Callable[[], torch.Tensor],
        index: int,
        sync: bool = True,
        skip: Iterable[torch.nn.Parameter] = (),
    ) -> torch.Tensor:
        """One pass, under the class weighting its index asks for."""
        if not self.last_perturbed:  # a plain step: the plain loss
            return super().run_pass(closure, index, sync, skip)
        self._weighted = False
        loss = super().run_pass(closure, index, sync, skip)
        _check(
            self._weighted,
            "FocalSAM weighs each sample by its class: compute the closure's loss with "
            "optimizer.reduce_loss(per_sample_loss, logits, targets)",
        )
        return loss

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """g_c at θ, ε = ρ g_c/‖g_c‖, then the passes whose gradients sum to Focal-SAM's."""
        loss, params, pgrads = self.first_pass(closure)  # g_c at θ
        c = self._cache
        self.compute_perturbation(params, pgrads, c["eps"])
        rest = self.run_pass(closure, 1, sync=True)  # g_1 at θ
        grads = self._lists()[1]
        self._unscale(grads)
        if "g1" not in c:
            c["g1"] = [torch.empty_like(p) for p in params]
        torch._foreach_copy_(c["g1"], grads)
        torch._foreach_copy_(c["theta"], params)
        torch._foreach_add_(params, c["eps"])
        self.descend(closure, 2, loss)
        return loss + rest  # the plain mean loss at θ

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Add the gradient of the (1 − c_y)-weighted loss at θ to the descent gradient."""
        torch._foreach_add_(self._lists()[1], self._cache["g1"])
