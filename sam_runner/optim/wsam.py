"""WSAM, weighted SAM (Yue et al., KDD 2023, "Sharpness-Aware Minimization Revisited: Weighted
Sharpness as a Regularization Term"; pytorch_optimizer's ``WSAM``).

The objective L(θ) + α (L(θ+ε) − L(θ)) with α = γ/(1 − γ), ε = ρ g/‖g‖ as in SAM; its gradient
is g + α (g_s − g), g = ∇L(θ), g_s = ∇L(θ+ε). ``decouple=true`` (the default, the paper's
decoupled form): the base optimizer steps with g, then θ ← θ − η α (g_s − g), η the group's
learning rate, outside the base optimizer (like AdamW's decoupled weight decay).
``decouple=false``: the base optimizer steps with g + α (g_s − g). Default γ = 0.9 (α = 9).

Ours: g̃ (weight decay in ε only under ``perturb_with_weight_decay``) builds ε, the plain g
enters the update; under data parallelism without ``sync_perturbation`` g is averaged across
processes before the mix (pytorch_optimizer averages it too), so every process takes the same
step. Gradient clipping (the engine's ``clip_grad_norm``) applies to the mixed gradient;
pytorch_optimizer's ``max_norm`` clips g_s before the mix.
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


@VARIANTS.register("wsam", "g + γ/(1−γ)·(g_s − g): sharpness as a weighted term (WSAM)")
class WSAM(SAM):
    variant_options = {"gamma": 0.9, "decouple": True}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            isinstance(self.gamma, (int, float)) and 0 <= self.gamma < 1,
            f"gamma must be a number in [0, 1), got {self.gamma!r}",
        )
        self.alpha = self.gamma / (1 - self.gamma)
        self.decouple = bool(self.decouple)
        self._sharpness = None  # g_s − g of this step, applied after the base step (decoupled)
        self._g = self._g_owners = None  # the first pass's gradient (tensors), until the update

    @override
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One WSAM step (``closure`` as the engine's)."""
        self._sharpness = None  # never a skipped step's: set anew by each perturbing step
        return super().step(closure)

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """SAM's ε; g itself kept for the weighted update (no copy: the parameters let go of
        it, so the second pass's backward writes g_s into new storage)."""
        super().compute_perturbation(params, grads, eps)
        if self._gathered is not None:  # sharded, each process's own g: the mean's shards
            self._g, self._g_owners = self.shards_of_mean(self._lists()[1]), None
            return
        self._g = self._lists()[1]
        self._g_owners = [p.grad for p in self._grad_holders()]
        for p in self._grad_holders():
            p.grad = None

    def _grad_holders(self) -> list[torch.Tensor]:
        """The tensors whose ``.grad`` the engine's gradient list reads (sharded: the DTensor
        parameters, whose local shards ``_lists`` lists)."""
        c = self._cache
        return c["sharded"] if "sharded" in c else c["params"]

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """The weighted gradient g + α (g_s − g), or with ``decouple`` g alone and g_s − g kept
        for after the base step."""
        g, gs = self._g, self._lists()[1]
        meaned = self._g_owners is None  # shards_of_mean's: already the mean over processes
        if not self.sync_perturbation and not meaned:
            self.all_reduce_mean_list_(g)  # g is this process's own: the same step everywhere
        if self.decouple and meaned:  # g_s − g apart; the gradients take g's values
            self._sharpness = torch._foreach_sub(gs, g)
            torch._foreach_copy_(gs, g)
        elif self.decouple:  # g_s − g in g_s's storage; the parameters take g back as their grad
            torch._foreach_sub_(gs, g)
            self._sharpness = gs
            for p, grad in zip(self._grad_holders(), self._g_owners):
                p.grad = grad
        else:  # g + α (g_s − g)
            torch._foreach_mul_(gs, self.alpha)
            torch._foreach_add_(gs, g, alpha=1 - self.alpha)
        self._g = self._g_owners = None

    @override
    def base_step(self) -> None:
        """The base optimizer's step, then with ``decouple`` θ ← θ − η α (g_s − g)."""
        super().base_step()
        if self._sharpness is None:
            return
        params = self._cache["params"]
        for (a, b), group in zip(self._cache["slices"], self.param_groups):
            if b > a:
                torch._foreach_add_(
                    params[a:b], self._sharpness[a:b], alpha=-group["lr"] * self.alpha
                )
        self._sharpness = None
