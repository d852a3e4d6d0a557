"""LookSAM (Liu et al., CVPR 2022): SAM's second pass only every k-th step, its direction reused.

On a refresh step (the first of every ``k`` steps the schedule perturbs) the step is SAM's:
g = ∇L(θ), ε = ρ g/‖g‖, g_s = ∇L(θ+ε); the base optimizer steps with g_s and the part of g_s
orthogonal to g is kept, g_v = g_s − (⟨g, g_s⟩/‖g‖²) g. On the k − 1 steps between, one pass
gives g and the base optimizer steps with g + α (‖g‖/‖g_v‖) g_v.

``decompose``: ``per_tensor`` (the default) takes the projection, ‖g‖ and ‖g_v‖ per parameter
tensor, as the community implementations do (pytorch_optimizer's ``LookSAM``, rollovd/LookSAM);
``global`` takes them over all parameters as one vector, as the paper writes the formula.
Ours: the constants of the per-tensor code (norms clamped at 1e-12 in the projection, 1e-8
added to ‖g_v‖), g without weight decay (with it under ``perturb_with_weight_decay``), and a
reuse step costs one pass (the community code runs two). Defaults k = 5 and α = 0.7.

With a ``perturb_schedule`` other than every-step, the steps it leaves plain are the base
optimizer's single pass and the k counts the steps it perturbs; ``perturbed_fraction`` counts
the refresh steps. g_v lives in the optimizer state (per parameter), so a resume is exact.
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
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT

DECOMPOSE = ("per_tensor", "global")


@VARIANTS.register("look_sam", "SAM every k-th step; between, g + α‖g‖/‖g_v‖ g_v (LookSAM)")
class LookSAM(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its g_v, kept between steps on the shards, comes from the refresh step's first-pass "
        "gradient"
    )
    variant_options = {"k": 5, "alpha": 0.7, "decompose": "per_tensor"}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1,
            f"k must be an integer >= 1, got {self.k!r}",
        )
        _check(
            isinstance(self.alpha, (int, float)) and 0 <= self.alpha < math.inf,
            f"alpha must be a finite number >= 0, got {self.alpha!r}",
        )
        _check(
            self.decompose in DECOMPOSE,
            f"decompose must be one of {DECOMPOSE}, got {self.decompose!r}",
        )
        self.look_count = 0  # steps taken as LookSAM steps (refresh or reuse)
        self._pending = None  # a refresh's g_v, kept once the step is not skipped (fp16)

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """SAM's two passes every ``k``-th step (g_v kept); one pass between, with g_v added."""
        refresh = self.look_count % self.k == 0
        self.look_count += 1
        if refresh:
            return self._refresh(closure)
        loss = self.run_pass(closure, 0, sync=True)
        params, grads, _ = self._lists()
        self._unscale(grads)
        self._track_grad_norm(grads)
        gv = [self.state[p].get("look_sam_gv") for p in params]
        if all(v is not None for v in gv):
            g_norm, gv_norm = self._norms(grads), self._norms(gv)
            scale = torch._foreach_div(g_norm, torch._foreach_add(gv_norm, 1e-8))
            torch._foreach_add_(grads, torch._foreach_mul(gv, scale), alpha=self.alpha)
        self.descent_loss = loss
        self.last_perturbed = False  # one pass: not a perturbed step
        return loss

    def _refresh(self, closure):
        """SAM's step, keeping g_v, the part of g_s orthogonal to g."""
        loss, params, g = self.first_pass(closure)
        c = self._cache
        if "g" not in c:
            c["g"] = [torch.empty_like(p) for p in params]
        torch._foreach_copy_(c["g"], g)  # the closure may zero the gradients in place
        self.perturbation_into(params, g, c["eps"])
        torch._foreach_copy_(c["theta"], params)
        torch._foreach_add_(params, c["eps"])
        self.descend(closure, 1, loss)
        g, gs = c["g"], self._lists()[1]
        if self.decompose == "global":
            coef = [self.dot(g, gs) / self.global_norm(g).clamp_min(1e-12) ** 2] * len(g)
        else:
            dots = self.tensor_dots(g, gs)
            coef = [d / n.clamp_min(1e-12) ** 2 for d, n in zip(dots, self.tensor_norms(g))]
        self._pending = (params, torch._foreach_sub(gs, torch._foreach_mul(g, coef)))
        return loss

    @override
    def _finish(self):
        super()._finish()
        pending, self._pending = self._pending, None
        if self.overflowed():  # a skipped fp16 step leaves no trace: count and g_v unchanged
            self.look_count -= 1
        elif pending is not None:
            for p, v in zip(*pending):
                self.state[p]["look_sam_gv"] = v

    def _norms(self, tensors):
        """‖·‖ per tensor, or the one global norm repeated (``decompose``)."""
        if self.decompose == "global":
            return [self.global_norm(tensors)] * len(tensors)
        return self.tensor_norms(tensors)

    @override
    def variant_state(self) -> dict:
        """The engine's state and the count of steps since the start."""
        return {**super().variant_state(), "look_count": self.look_count}

    @override
    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        self.look_count = int(state.get("look_count", 0))
