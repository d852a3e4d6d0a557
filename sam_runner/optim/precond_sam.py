"""PrecondSAM: SAM under a slow diagonal preconditioner, in the spirit of LLQR+SAM.

This is a diagonal stand-in for the LLQR preconditioner, not LLQR. U = 1 / (F + δ), F an
EMA (β = 0.95) of g², refreshed every K = ``refresh_every`` = 100 perturbing steps (the
first refresh sets F = g²); ε = ρ U g / ‖U g‖: the preconditioner sets the direction, and ρ
is the Euclidean radius, ‖ε‖₂ = ρ, as in SAM (ours: U's scale, and so the meaning of ρ,
would otherwise depend on the magnitude of F). Computed from R = sqrt(U) kept in persistent
buffers (rescaled to mean(U) = 1 at each refresh, for the numbers' range only: ε does not
depend on U's scale): ε = ρ R (R g) / ‖R (R g)‖, the norm floored at 1e-30 rather than
guarded by an added 1e-12 (U g can be tiny). A refresh is staged and committed after the
second pass, with the step count, so a step skipped by the fp16 scaler (either pass
overflowing) leaves F, R and the count unchanged.

From the abstract (LLQR+SAM): a preconditioner updated sparsely and kept as a slow EMA,
with the SAM perturbation on top of it. Ours (docs/variants.md): the diagonal Fisher-like
F, its refresh rule and defaults, δ = ``delta`` = 1e-8, the Euclidean radius and the
first-refresh initialisation. Also ours: under data parallelism with per-process
perturbations (``sync_perturbation=False``) a refresh takes the mean over processes of g²
(one all-reduce of the parameters' size every ``refresh_every`` perturbing steps), so every
process keeps the same F and U (and a checkpoint of one process resumes them all); ε still
uses the process's own g. With ``sync_perturbation=True`` g is already averaged.
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


@VARIANTS.register(
    "precond_sam", "SAM under a slow diagonal preconditioner (in the spirit of LLQR+SAM)"
)
class PrecondSAM(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its preconditioner F, read by ε, is per-parameter state on the shards"
    )
    variant_options = {"refresh_every": 100, "beta": 0.95, "delta": 1e-8}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            int(self.refresh_every) >= 1,
            f"refresh_every must be an integer >= 1, got {self.refresh_every}",
        )
        _check(0 <= self.beta < 1, f"beta must be in [0, 1), got {self.beta}")
        _check(self.delta > 0, f"delta must be > 0, got {self.delta}")
        self.refresh_every = int(self.refresh_every)
        self.perturb_count = 0

    def _buffers(self, params):
        """F (EMA of g²) and R = sqrt(U) = (F + δ)^(-1/2), one per parameter, in the optimizer
        state.
        """
        c = self._cache
        if "fisher" not in c:
            for p in params:
                if "fisher" not in self.state[p]:
                    self.state[p]["fisher"] = torch.zeros_like(p)
                    self.state[p]["root_u"] = torch.zeros_like(p)
            c["fisher"] = [self.state[p]["fisher"] for p in params]
            c["root_u"] = [self.state[p]["root_u"] for p in params]
        return c["fisher"], c["root_u"]

    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = ρ U g / ‖U g‖; every ``refresh_every`` perturbing steps a new F and U staged."""
        fisher, root_u = self._buffers(params)
        self._staged = None
        if self.perturb_count % self.refresh_every == 0:
            new_f = torch._foreach_mul(grads, grads)
            if not self.sync_perturbation:  # F is global: the mean g² over processes
                self.all_reduce_mean_list_(new_f)
            if self.perturb_count > 0:
                torch._foreach_lerp_(new_f, fisher, self.beta)  # F ← β F + (1 − β) g²
            root_u = torch._foreach_add(new_f, self.delta)
            torch._foreach_rsqrt_(root_u)  # R = (F + δ)^(-1/2)
            # U / mean(U): only for the numbers' range (ε does not depend on U's scale)
            numel = sum(p.numel() for p in self._cache.get("sharded", params))  # whole tensors
            torch._foreach_mul_(root_u, numel**0.5 / self.global_norm(root_u))
            self._staged = (new_f, root_u)  # committed after the second pass, unless skipped
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, root_u)
        torch._foreach_mul_(eps, root_u)  # U g
        # ‖ε‖ = ρ; U g can be tiny (U's scale is arbitrary): a floor, not an added guard
        torch._foreach_mul_(eps, self.current_rho / self.global_norm(eps).clamp_min(1e-30))

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Commit the staged F and U and count the step, unless the fp16 step was skipped."""
        # found_inf exists under fp16 scaling only: one host sync there (the count lives on the
        # host)
        if self._found_inf is not None and self._found_inf.item():
            return
        if self._staged is not None:
            torch._foreach_copy_(self._cache["fisher"], self._staged[0])
            torch._foreach_copy_(self._cache["root_u"], self._staged[1])
        self._staged = None  # free the staged copies
        self.perturb_count += 1

    def variant_state(self) -> dict:
        """The engine's state and the count of perturbing steps."""
        return {**super().variant_state(), "perturb_count": self.perturb_count}

    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        self.perturb_count = int(state["perturb_count"])
