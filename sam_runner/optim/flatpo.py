"""FlatPO (Flatness Preference Optimization; known from its abstract and public code): SAM on
the sharpest fraction of the trainable dimensions.

The abstract: in parameter-efficient fine-tuning "a small fraction of sharp dimensions dominates
the generalization", and FlatPO flattens those. Here a dimension is one coordinate of the
trainable parameters (under ``model.peft`` the adapters'), its sharpness score the diagonal of
the empirical Fisher, F = an EMA (β = ``beta`` = 0.9) of g² updated on every perturbing step
(the first sets F = g²). Every ``refresh_every`` = 10 perturbing steps (and on the first) the mask
m keeps the ``fraction`` = 0.05 of coordinates with the largest F (exactly ⌈fraction·N⌉ of the N
trainable coordinates, by ``torch.topk``), and between refreshes it stays. Then
ε = ρ (m ⊙ g) / ‖m ⊙ g‖: the radius is ρ within the chosen coordinates, and with fraction = 1 it
is SAM's ε, bit for bit.

Ours (docs/fine_tuning.md#flatpo): the coordinate granularity, the Fisher score and its EMA,
the refresh rule, and normalising by the masked gradient. The public code ranks whole tensors by
‖g‖ (those at or above the 95th percentile) at every step and keeps SAM's ρ/‖g‖ scale, so its ‖ε‖
is below ρ. Like PrecondSAM, F and m are staged and committed after the second pass (a step the
fp16 scaler skips leaves them, and the count, unchanged), and under data parallelism with
per-process ε a refresh ranks the mean F over processes, so every process keeps the same mask.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register("flatpo", "SAM on the sharpest fraction of the trainable coordinates (FlatPO)")
class FlatPO(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its Fisher scores and mask, read by ε, are per-parameter state on the shards"
    )
    variant_options = {"fraction": 0.05, "refresh_every": 10, "beta": 0.9}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        fraction = self.fraction
        _check(
            not isinstance(fraction, bool)
            and isinstance(fraction, (int, float))
            and 0 < fraction <= 1,
            f"fraction={fraction!r} must be a number in (0, 1] (the share of the trainable "
            "coordinates perturbed)",
        )
        _check(
            int(self.refresh_every) >= 1,
            f"refresh_every must be an integer >= 1, got {self.refresh_every}",
        )
        _check(0 <= self.beta < 1, f"beta must be in [0, 1), got {self.beta}")
        self.fraction, self.refresh_every = float(fraction), int(self.refresh_every)
        self.perturb_count = 0
        self._staged = None

    def _buffers(self, params):
        """F (EMA of g²) and the mask m (0/1 in the parameters' dtype), in the optimizer state."""
        c = self._cache
        if "fisher" not in c:
            for p in params:
                if "fisher" not in self.state[p]:
                    self.state[p]["fisher"] = torch.zeros_like(p)
                    self.state[p]["mask"] = torch.ones_like(p)
            c["fisher"] = [self.state[p]["fisher"] for p in params]
            c["mask"] = [self.state[p]["mask"] for p in params]
        return c["fisher"], c["mask"]

    def sharpest(self, fisher: Sequence[torch.Tensor]) -> list:
        """The 0/1 mask of the ⌈fraction·N⌉ coordinates with the largest F (ties by topk)."""
        local = torch.cat([f.reshape(-1) for f in fisher])
        flat, start = self.gathered(local)  # sharded: every process's coordinates
        k = max(1, math.ceil(self.fraction * flat.numel()))
        mask = torch.zeros_like(flat)
        mask[torch.topk(flat, k, sorted=False).indices] = 1
        mask = mask[start : start + local.numel()]
        return [m.view_as(f) for m, f in zip(mask.split([f.numel() for f in fisher]), fisher)]

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """SAM's ε on the sharpest coordinates of the Fisher EMA (the update staged until the
        step is known not skipped)."""
        fisher, mask = self._buffers(params)
        new_f = torch._foreach_mul(grads, grads)
        if self.perturb_count > 0:
            torch._foreach_lerp_(new_f, fisher, self.beta)  # F ← β F + (1 − β) g²
        new_mask = None
        if self.perturb_count % self.refresh_every == 0:
            ranked = new_f
            if not self.sync_perturbation:  # one mask on every process: rank the mean F
                ranked = [f.clone() for f in new_f]
                self.all_reduce_mean_list_(ranked)
            new_mask = self.sharpest(ranked)
        self._staged = (new_f, new_mask)
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, mask if new_mask is None else new_mask)
        torch._foreach_mul_(eps, self.current_rho / (self.global_norm(eps) + 1e-12))

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Commit the staged Fisher EMA and mask, unless the fp16 step was skipped."""
        if self._found_inf is not None and self._found_inf.item():  # fp16 only: a skipped step
            self._staged = None
            return
        if self._staged is not None:
            new_f, new_mask = self._staged
            torch._foreach_copy_(self._cache["fisher"], new_f)
            if new_mask is not None:
                torch._foreach_copy_(self._cache["mask"], new_mask)
        self._staged = None
        self.perturb_count += 1

    def variant_state(self) -> dict:
        """The engine's state and the count of perturbing steps."""
        return {**super().variant_state(), "perturb_count": self.perturb_count}

    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        self.perturb_count = int(state["perturb_count"])
