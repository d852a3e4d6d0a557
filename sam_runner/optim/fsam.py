"""F-SAM, Friendly SAM (Li et al., CVPR 2024; official code nblt/F-SAM).

The first-pass gradient g mixes the full-batch gradient's direction with batch noise; F-SAM
perturbs along the noise alone: an EMA m of g estimates the full-batch part and
ε = ρ d/‖d‖ with d = g − σ m, m the EMA *before* this step's update, then
m ← λ m + (1 − λ) g. On the first perturbing step m = g and d = g (SAM's step), as the
official code and pytorch_optimizer's ``FriendlySAM`` do. Defaults σ = 1, λ = 0.9 (theirs).

Ours: m is updated on the steps that perturb only (a plain step under ``perturb_schedule`` or
``interval`` leaves it), from g̃ (g, with weight decay only under ``perturb_with_weight_decay``);
the new m is committed after the second pass, so a step the fp16 scaler skips leaves no trace.
m lives in the optimizer's per-parameter state (``fsam_momentum``): a resume is exact. Under data
parallelism with per-process ε (``sync_perturbation=false``) m is the EMA of the gradient
averaged over processes (one all-reduce a step), so every process holds the same m and one
process's checkpoint resumes them all; d uses the process's own g. The official code keeps
one m per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@VARIANTS.register("fsam", "ε along g − σ·EMA(g), the batch noise (Friendly SAM, Li et al. 2024)")
class FSAM(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its momentum m, read by ε, is per-parameter state on the shards"
    )
    variant_options = {"sigma": 1.0, "lmbda": 0.9}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(0 <= self.sigma < float("inf"), f"sigma must be a number >= 0, got {self.sigma}")
        _check(0 <= self.lmbda <= 1, f"lmbda must be in [0, 1], got {self.lmbda}")
        self._staged = None

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ d/‖d‖, d = g − σ m (d = g on the first perturbing step); the new m staged."""
        old = [self.state[p].get("fsam_momentum") for p in params]
        if any(m is None for m in old):  # the first perturbing step: d = g, m = g
            torch._foreach_copy_(eps, grads)
            self._staged = (params, self._mean([g.clone() for g in grads]))
        else:
            torch._foreach_copy_(eps, grads)
            torch._foreach_add_(eps, old, alpha=-self.sigma)  # d = g − σ m
            self._staged = (params, torch._foreach_lerp(old, self._mean(grads), 1 - self.lmbda))
        torch._foreach_mul_(eps, self.current_rho / (self.global_norm(eps) + 1e-12))

    def _mean(self, grads):
        """g averaged over data-parallel processes (per-process ε): one m on every process."""
        if self.sync_perturbation or not _distributed():
            return grads
        out = [g.clone() for g in grads]
        self.all_reduce_mean_list_(out)
        return out

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Commit the staged EMA m, unless the fp16 step was skipped."""
        staged, self._staged = self._staged, None
        if staged is None or self.overflowed():  # a skipped fp16 step leaves m as it was
            return
        for p, m in zip(*staged):
            self.state[p]["fsam_momentum"] = m
