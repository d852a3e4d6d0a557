"""CSAM (calibration-aware SAM; known from its abstract, the reweighting from secondary
descriptions).

SAM's perturbation ε = ρ g / ‖g‖ from the plain loss; the descent loss at θ+ε weights each
sample's loss by w_i = (1 − p_{y_i})^γ, p_y the predicted probability of the true class at
θ+ε (weights detached, renormalised to mean 1 over the batch). γ = 0 is SAM. Default γ = 1.

The loss a pass backpropagates comes from ``reduce_loss(per_sample_loss, logits, targets)``;
a training loop of your own must call it in every pass, for example::

    def closure():
        opt.zero_grad()
        logits = model(x)
        loss = opt.reduce_loss(F.cross_entropy(logits, y, reduction="none"), logits, y)
        loss.backward()
        return loss

Mean 1 over the batch, under gradient accumulation: each micro-batch backpropagates
mean(w ℓ) unnormalised while ``reduce_loss`` sums Σw and the sample count; after the pass,
this class's ``after_second_pass`` (not the engine) multiplies the accumulated descent
gradient by count / Σw, i.e. divides it by the mean weight of the whole batch, which is
exactly the one-big-batch result (with equal micro-batch sizes). Under data parallelism
[Σw, count] is averaged across processes first, so that every process divides by the global
batch's mean weight and applies the same gradient. Gradient clipping, when set, comes after
this division. On steps that do not perturb (``interval`` > 1) and in the first pass the
plain mean loss is used. Ours: the weight formula and its normalisation (the abstract does
not give the method's details).
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
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register("csam", "SAM's ε; descent loss per sample weighted by (1 − p_y)^γ (CSAM)")
class CSAM(SAM):
    variant_options = {"gamma": 1.0}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(self.gamma >= 0, f"gamma must be >= 0, got {self.gamma}")
        self._weight_sum = None  # Σ w and sample count over the descent pass (device tensor [2])

    def reduce_loss(
        self, per_sample_loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """The descent pass's loss with each sample weighted by (1 − p_y)^γ (renormalised to mean
        1); the plain mean otherwise."""
        if self.pass_index != 1 or not self.last_perturbed:
            return per_sample_loss.mean()
        with torch.no_grad():
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp16/bf16 → fp32
            logits, labels = token_pairs(logits, targets)  # a sequence model's: one row a token
            p_true = torch.softmax(logits, dim=1).gather(1, labels[:, None]).squeeze(1)
            # a window's weight is its tokens' mean (ours): one weight per per-sample loss
            w = (1 - p_true).pow(self.gamma).view(len(per_sample_loss), -1).mean(dim=1)
            stats = torch.stack([w.sum(), w.new_tensor(float(w.numel()))])
            self._weight_sum = stats if self._weight_sum is None else self._weight_sum + stats
        return (w * per_sample_loss).mean()

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Check the descent loss was reweighted, and reset the weights' sums."""
        stats, self._weight_sum = self._weight_sum, None
        if stats is None:
            raise ValueError(
                "CSAM reweights the descent loss: the closure must compute its loss with "
                "optimizer.reduce_loss(per_sample_loss, logits, targets)"
            )
        stats = self.all_reduce_mean_(stats)
        grads = self._lists()[1]
        torch._foreach_mul_(grads, stats[1] / stats[0].clamp_min(1e-12))  # divide by mean(w)
