"""ASAM (Kwon et al., 2021): adaptive SAM, ε = ρ T² g / ‖T g‖.

T = |θ| + η elementwise on weight tensors (conv, linear and normalisation weights) and
T = 1 on biases, as in the paper. Which tensors are weights: the parameter group's
``kind`` key ('weight' or 'bias', set by the runner's parameter groups); for a plain
parameter list, tensors with more than one dimension are weights (so normalisation
weights count as biases there: build groups with ``kind`` to treat them as weights).
Defaults η = 0.01, ρ = 0.5 (the paper's scale, about 10× SAM's). The adaptive worst-case
sharpness measure (``metrics.sharpness.worst_case.adaptive``) uses the same ball, with the
runner's weight/bias split (optim/blocks.py ``is_bias``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..registry import VARIANTS
from .engine import SharpnessAware, _check

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


@VARIANTS.register("asam", "ε = ρ T²g/‖Tg‖ with T = |θ| + η on weights (Kwon et al. 2021)")
class ASAM(SharpnessAware):
    variant_options = {"eta": 0.01}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(self.eta >= 0, f"eta must be >= 0, got {self.eta}")

    def _split(self, params):
        """Indices of weight tensors and of bias tensors in the engine's flat list (cached)."""
        c = self._cache
        if "weights" not in c:
            kinds = self.per_parameter("kind", lambda p, _: "weight" if p.ndim > 1 else "bias")
            flags = [kind == "weight" for kind in kinds]
            c["weights"] = [i for i, w in enumerate(flags) if w]
            c["biases"] = [i for i, w in enumerate(flags) if not w]
            c["t"] = [torch.empty_like(params[i]) for i in c["weights"]]  # persistent T buffer
        return c["weights"], c["biases"], c["t"]

    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ T² g / ‖T g‖, T = |θ| + η on weights and 1 on biases."""
        wi, bi, t = self._split(params)
        pw, gw, ew = [params[i] for i in wi], [grads[i] for i in wi], [eps[i] for i in wi]
        gb, eb = [grads[i] for i in bi], [eps[i] for i in bi]
        if pw:
            torch._foreach_copy_(t, pw)
            torch._foreach_abs_(t)
            torch._foreach_add_(t, self.eta)  # T = |θ| + η
            torch._foreach_copy_(ew, gw)
            torch._foreach_mul_(ew, t)  # T g
        if gb:
            torch._foreach_copy_(eb, gb)  # T g with T = 1
        scale = self.current_rho / (self.global_norm(ew + eb) + 1e-12)
        if pw:
            torch._foreach_mul_(ew, t)  # T² g
        torch._foreach_mul_(eps, scale)
