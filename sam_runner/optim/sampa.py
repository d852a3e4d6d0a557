"""SAMPa, SAM parallelized (Xie et al., NeurIPS 2024; official code LIONS-EPFL/SAMPa).

SAM's two gradients depend on each other (ε needs the first); SAMPa makes them independent by
building ε from the gradient at an auxiliary point y_t computed in the previous step:

    x̃_t = x_t + ρ ∇f(y_t)/‖∇f(y_t)‖,   y_{t+1} = x_t − η ∇f(y_t),
    x_{t+1} = x_t − η ((1 − λ) ∇f(x̃_t) + λ ∇f(y_{t+1}))

(the base optimizer applies the mixed gradient at x_t). ∇f(x̃_t) and ∇f(y_{t+1}) need only
∇f(y_t): the official code computes them on two GPUs at once. Defaults ρ = 0.1, λ = ``lam`` = 0.2
(the official script's ``--rho``, ``--og``).

Here the two passes run one after the other on one process (pass 0 at x̃_t, pass 1 at
y_{t+1}), with a notice; the two-process form is not implemented, and a data-parallel job runs
the same sequential passes on every process (both synchronised). Ours: both passes on the
step's batch (the official code evaluates ∇f(x̃_t) on the previous step's batch, the one
∇f(y_t) came from); y_{t+1} = x_t − η ∇f(y_t) with the group's learning rate, as the paper
writes it (the official code adds the SGD momentum buffer and weight decay to the look-ahead);
∇f(y) is kept in the optimizer's per-parameter state (``sampa_gy``; a resume is exact, a step
the fp16 scaler skips leaves it); on the first step ∇f(y_0) = 0, so both passes run at x_0, as
in the official code; the loss a step returns is f(x̃_t). BatchNorm running statistics come from
the pass at x̃_t.
"""

from __future__ import annotations

import warnings
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


@VARIANTS.register("sampa", "ε from the gradient at y_t = x − η∇f(y): two independent passes")
class SAMPa(SAM):
    variant_options = {"lam": 0.2}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(0 <= self.lam <= 1, f"lam must be in [0, 1], got {self.lam}")
        warnings.warn(
            "sampa: the two gradients run one after the other on this process (the two-process "
            "form is not implemented)",
            stacklevel=2,
        )
        self._staged, self._buffers = None, {}

    def _buffer(self, params, slot: str):
        key = (slot, tuple(id(p) for p in params))
        if key not in self._buffers:
            self._buffers = {k: v for k, v in self._buffers.items() if k[0] != slot}
            self._buffers[key] = [torch.empty_like(p) for p in params]
        return self._buffers[key]

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The gradient at the auxiliary point y_t (for the next step's ε) and the descent pass
        at x_t + ε."""
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        trained = self.shards(trained)  # sharded: the local shards
        gy = [self.state[p].get("sampa_gy") for p in trained]
        known = all(g is not None for g in gy) and bool(trained)
        x = self._buffer(trained, "x")
        torch._foreach_copy_(x, trained)
        if known:  # x̃ = x + ρ g_y/‖g_y‖
            step = self._buffer(trained, "step")
            torch._foreach_copy_(step, gy)
            torch._foreach_mul_(step, self.current_rho / (self.global_norm(gy) + 1e-12))
            torch._foreach_add_(trained, step)
        loss = self.run_pass(closure, 0, sync=True)
        torch._foreach_copy_(trained, x)
        params, grads, slices = self._lists()
        self._unscale(grads)
        self._track_grad_norm(grads)
        g_pert = self._buffer(params, "g_pert")
        torch._foreach_copy_(g_pert, grads)
        if known:  # y = x − η g_y, each group's learning rate
            at = {id(p): i for i, p in enumerate(trained)}
            for (a, b), group in zip(slices, self.param_groups):
                ps = params[a:b]
                if ps and group["lr"]:
                    torch._foreach_add_(ps, [gy[at[id(p)]] for p in ps], alpha=-group["lr"])
        self.run_pass(closure, 1, sync=True)
        torch._foreach_copy_(trained, x)
        grads = self._lists()[1]
        self._unscale(grads)
        self._staged = (params, [g.clone() for g in grads])  # ∇f(y_{t+1}), kept unless skipped
        torch._foreach_mul_(grads, self.lam)
        torch._foreach_add_(grads, g_pert, alpha=1 - self.lam)  # (1 − λ) g_x̃ + λ g_y
        self.descent_loss = loss
        return loss

    @override
    def _finish(self):
        super()._finish()
        staged, self._staged = self._staged, None
        if staged is None or self.overflowed():
            return
        for p, g in zip(*staged):
            self.state[p]["sampa_gy"] = g
