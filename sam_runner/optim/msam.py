"""MSAM, momentum-SAM (Becker et al. 2024, "Momentum-SAM: Sharpness Aware Minimization without
Computational Overhead"; official code MarlonBecker/MSAM ``optimizer/msam.py``).

SAM's ascent direction replaced by the momentum's: the one pass of a step runs at
θ + ρ Δ/‖Δ‖, Δ the base optimizer's last update (θ_t − θ_{t−1}), and the base optimizer applies
that gradient at θ. For SGD with momentum Δ = −η v, so the point is θ − ρ v/‖v‖, the official
code's; Δ = 0 (the first step) is no perturbation, as the official zero-initialised buffer.
One forward-backward a step: the schedules of the engine apply (a plain step runs at θ), except
``adaptive``, which needs a pass at θ that MSAM does not take. Default ρ = 0.3 (the official
code's; the paper's CIFAR runs use ρ of 0.3 to 3).

Ours: the direction is read off the parameters, not the base optimizer's buffer, so every base
optimizer works (for AdamW it is the direction of its last step); Δ lives in the optimizer's
per-parameter state (``msam_delta``), updated by every step the base optimizer takes (a step
skipped by the fp16 scaler leaves it), so a resume is exact. The parameters hold θ between
steps (the official code keeps θ + ε and moves back for evaluation). Weight decay enters the
base step at θ; the official code adds it to the gradient at the perturbed point (a difference of
wd·ρ·v/‖v‖ in the gradient). BatchNorm running statistics come from the pass at θ + ε, as in
the official code.
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


@VARIANTS.register("msam", "one pass at θ + ρΔ/‖Δ‖, Δ the last update (momentum-SAM)")
class MSAM(SAM):
    passes = 1
    single_pass_perturbation = True

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.3,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(
            self.perturb_schedule != "adaptive",
            "perturb_schedule='adaptive' does not apply to msam (it decides on a pass at θ, which "
            "MSAM does not take); use every, random or late",
        )
        self._buffers = {}

    def _buffer(self, params, slot: str):
        """A persistent buffer per parameter of ``params`` (one list per ``slot``)."""
        key = (slot, tuple(id(p) for p in params))
        if key not in self._buffers:
            self._buffers = {k: v for k, v in self._buffers.items() if k[0] != slot}
            self._buffers[key] = [torch.empty_like(p) for p in params]
        return self._buffers[key]

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The one pass at θ + ρ Δ/‖Δ‖ (Δ the last update; at θ before any), θ then restored."""
        groups = self.param_groups
        every = self.shards([p for g in groups for p in g["params"]])  # sharded: local shards
        params = [p for p in every if "msam_delta" in self.state[p]]
        if params:
            delta = [self.state[p]["msam_delta"] for p in params]
            theta, step = self._buffer(params, "theta"), self._buffer(params, "step")
            torch._foreach_copy_(theta, params)
            torch._foreach_copy_(step, delta)
            torch._foreach_mul_(step, self.current_rho / (self.global_norm(delta) + 1e-12))
            torch._foreach_add_(params, step)  # θ + ρ Δ/‖Δ‖
        loss = self.run_pass(closure, 0, sync=True)
        if params:
            torch._foreach_copy_(params, theta)
        grads = self._lists()[1]
        self._unscale(grads)
        self._track_grad_norm(grads)
        self.descent_loss = loss
        return loss

    @override
    def base_step(self) -> None:
        """The base optimizer's step, its update Δ kept for the next step."""
        params = self._lists()[0]
        before = self._buffer(params, "theta")
        torch._foreach_copy_(before, params)
        super().base_step()
        for p in params:  # Δ = θ_new − θ_old, kept in place once it exists
            if "msam_delta" not in self.state[p]:
                self.state[p]["msam_delta"] = torch.empty_like(p)
        delta = [self.state[p]["msam_delta"] for p in params]
        torch._foreach_copy_(delta, params)
        torch._foreach_sub_(delta, before)
