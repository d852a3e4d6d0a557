"""Functional-SAM (Singh, Mobahi, Agarwala, Dauphin, ICML 2025, "Avoiding spurious sharpness
minimization broadens applicability of SAM", arXiv 2502.02407), and its preconditioned form.

SAM's descent gradient ∇L(θ+ε) = J(θ+ε)ᵀ ∇_F ℓ(F(θ+ε)) moves both the network's Jacobian
(the functional path) and the loss's derivative in the logits (the logit path); the paper finds
the logit path dominates on language models, where it lowers sharpness without improving the
function. Functional-SAM keeps the functional path only: the descent gradient is
J(θ+ε)ᵀ δ with δ = ∇_F ℓ(F(θ)), the derivative at the *unperturbed* logits; ε = ρ g/‖g‖ as in
SAM. ``precondition=adam``: ε = ρ P g/‖P g‖ with P = 1/(√v̂ + ε_adam), v̂ the base optimizer's
bias-corrected second moment (an Adam-family base; the paper's preconditioned SAM perturbation,
which it combines with Functional-SAM); before the base's first step P = 1.

Two passes, as SAM: pass 0 at θ also takes δ from the logits (a backward through the loss
function alone); pass 1 at θ + ε backpropagates ⟨F(θ+ε), δ⟩, whose gradient is J(θ+ε)ᵀ δ
(the value reported is L(θ+ε)). δ reaches the pass through ``reduce_loss(per_sample_loss,
logits, targets)``: a training loop of its own must compute its loss with it (the runner's loop
does), micro-batches in the same order in both passes; a closure that does not is refused.
Ours: δ is that of each micro-batch's mean loss (the closure's weights and the fp16 scale apply
to the surrogate as to a loss); under data parallelism δ is per process (each process's own
micro-batches) and pass 1 is synchronised.
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

PRECONDITIONS = ("none", "adam")


@VARIANTS.register(
    "functional_sam", "descent J(θ+ε)ᵀ∇_Fℓ(F(θ)): the functional path only (Functional-SAM)"
)
class FunctionalSAM(SAM):
    variant_options = {"precondition": "none"}

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(
            self.precondition in PRECONDITIONS,
            f"precondition must be one of {PRECONDITIONS}, got {self.precondition!r}",
        )
        _check(
            self.precondition == "none" or "betas" in self.base_optimizer.defaults,
            f"precondition='adam' reads an Adam-family base optimizer's second moment; "
            f"{type(self.base_optimizer).__name__} has none (use base_optimizer=adamw)",
        )
        self._deltas, self._next = [], 0

    @override
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One Functional-SAM step (``closure`` as the engine's)."""
        self._deltas, self._next = [], 0
        return super().step(closure)

    @override
    def reduce_loss(
        self, per_sample_loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """The mean loss; at θ the logits' derivative δ is kept, at θ + ε the loss's gradient
        becomes J(θ+ε)ᵀ δ (the functional path alone)."""
        loss = per_sample_loss.mean()
        if not torch.is_grad_enabled() or not logits.requires_grad:
            return loss
        if self.pass_index == 0:  # δ = ∂(mean loss)/∂logits at θ, per micro-batch
            (delta,) = torch.autograd.grad(loss, logits, retain_graph=True)
            self._deltas.append(delta.detach())
            return loss
        if self._next >= len(self._deltas):
            raise ValueError(
                "FunctionalSAM: the perturbed pass has more micro-batches than the first; both "
                "passes must compute their losses with optimizer.reduce_loss, in the same order"
            )
        delta = self._deltas[self._next]
        self._next += 1
        linear = (logits * delta.to(logits.dtype)).sum()  # gradient J(θ+ε)ᵀ δ
        return loss.detach() + (linear - linear.detach())

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """SAM's ε (Adam-preconditioned with ``precondition='adam'``), once the logits'
        derivative is recorded."""
        _check(
            bool(self._deltas),
            "FunctionalSAM needs the logits' derivative: compute the closure's loss with "
            "optimizer.reduce_loss(per_sample_loss, logits, targets)",
        )
        torch._foreach_copy_(eps, grads)
        if self.precondition == "adam":
            self._precondition_(eps)
        torch._foreach_mul_(eps, self.current_rho / (self.global_norm(eps) + 1e-12))

    def _precondition_(self, eps) -> None:
        """eps ← eps / (√v̂ + ε_adam) per group, v̂ the base's bias-corrected second moment."""
        state, c = self.base_optimizer.state, self._cache
        # sharded: the base's state is keyed by the parameters (DTensors), not the listed tensors
        owners, whole = self.state_owners(), self._gathered is not None
        for (a, b), group in zip(c["slices"], self.param_groups):
            beta2, adam_eps = group["betas"][1], group.get("eps", 1e-8)
            for p, e in zip(owners[a:b], eps[a:b]):
                s = state.get(p, {})
                if "exp_avg_sq" not in s:
                    continue
                step = float(s["step"])
                v = s["exp_avg_sq"]
                if hasattr(v, "to_local"):  # a DTensor: ε's lists hold its shard, or the whole
                    v = v.full_tensor() if whole else v.to_local()
                e.div_((v / (1 - beta2**step)).sqrt_().add_(adam_eps))

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Forget the step's logit derivatives."""
        self._deltas, self._next = [], 0
