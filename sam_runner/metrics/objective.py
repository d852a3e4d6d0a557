"""The mean loss over fixed batches as a function of the flattened trainable parameters.

Each batch's mean loss is weighted by its share of the samples, so the value is the mean over
all samples. While an ``Objective`` is open, BatchNorm running statistics never change (in train
mode BatchNorm normalises with batch statistics, which are part of the function) and the
forward replacements of fast_forwards.py are in place.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..module_state import frozen_running_stats
from .fast_forwards import affine_eval_batchnorm, matmul_conv1d

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from typing import Any

    from torch import nn


def mean_loss(loss: torch.Tensor) -> torch.Tensor:
    """The mean of a per-sample loss (a scalar as it is)."""
    return loss.mean() if loss.dim() > 0 else loss


def grad_or_zero(
    outputs: torch.Tensor, params: Sequence[torch.Tensor], **kwargs: Any
) -> tuple[torch.Tensor, ...]:
    """``autograd.grad`` with zeros for trainable parameters the loss does not use (their Hessian
    rows are zero), instead of autograd's error."""
    return torch.autograd.grad(outputs, params, allow_unused=True, materialize_grads=True, **kwargs)


class Objective:
    """The mean loss over ``batches`` as a function of the flattened trainable parameters:
    its value and gradient, and in-place moves of the parameters (for sharpness probes)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.model, self.loss_fn = model, loss_fn
        self.batches = [(x, y) for x, y in batches]
        if not self.batches:
            raise ValueError(
                "batches is empty: the Hessian needs at least one (inputs, targets) batch"
            )
        empty = [i for i, (_, y) in enumerate(self.batches) if len(y) == 0]
        if empty:  # its weight would be 0/0
            raise ValueError(
                f"batch {empty[0]} of batches is empty: every batch needs at least one sample"
            )
        total = sum(len(y) for _, y in self.batches)
        self.weights = [len(y) / total for _, y in self.batches]
        self.names, self.params = self._trainable(model)
        self.shapes = [p.shape for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        self._stack = contextlib.ExitStack()
        for context in self._contexts(model):
            self._stack.enter_context(context)
        self._stack.enter_context(frozen_running_stats(model.modules()))
        self._stack.enter_context(affine_eval_batchnorm(model))
        self._stack.enter_context(matmul_conv1d(model))
        # attention (model=gpt): the fused kernels have no second derivative; the math one does
        self._stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        self._stack.enter_context(torch.enable_grad())

    def _contexts(self, model: nn.Module) -> list:  # noqa: ARG002 (a subclass's hook)
        """Contexts a subclass opens on ``model`` first, for as long as the objective is open."""
        return []

    def _trainable(self, model: nn.Module) -> tuple[list, list]:
        """(names, tensors) of the parameters the objective is a function of."""
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return [n for n, _ in named], [p for _, p in named]

    def flat(self, ts: Iterable[torch.Tensor]) -> torch.Tensor:
        """The tensors ``ts`` (one per parameter) as one flat vector."""
        return torch.cat([t.reshape(-1) for t in ts])

    def unflat(self, v: torch.Tensor) -> list:
        """The flat vector ``v`` as one view per parameter, in their shapes."""
        return [
            c.view(s) for c, s in zip(v.split([math.prod(s) for s in self.shapes]), self.shapes)
        ]

    def close(self) -> None:
        """Restore the model's modes and the attention kernels the objective changed."""
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def batch_loss(self, i: int, params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """Batch ``i``'s mean loss times its weight (its share of the samples), at ``params``
        when given."""
        x, y = self.batches[i]
        return mean_loss(self.loss_fn(self._forward(x, params), y)) * self.weights[i]

    def _forward(self, x: torch.Tensor, params: Sequence[torch.Tensor] | None) -> torch.Tensor:
        """The model's output on ``x``, at ``params`` when given."""
        if params is None:
            return self.model(x)
        return torch.func.functional_call(self.model, dict(zip(self.names, params)), (x,))

    @torch.no_grad()
    def loss(self) -> torch.Tensor:
        """The mean loss over all batches (no graph)."""
        return sum(self.batch_loss(i).detach() for i in range(len(self.batches)))

    def gradient(self) -> torch.Tensor:
        """The flat gradient of the mean loss over all batches."""
        g = torch.zeros(self.numel, device=self.device, dtype=self.dtype)
        for i in range(len(self.batches)):
            g += self.flat(grad_or_zero(self.batch_loss(i), self.params))
        return g

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """Put the parameters back bit for bit afterwards (additions and subtractions round)."""
        saved = [p.detach().clone() for p in self.params]
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, saved)

    @torch.no_grad()
    def shift(self, delta: torch.Tensor, scale: float = 1.0) -> None:
        """θ ← θ + scale·delta (flat ``delta``)."""
        torch._foreach_add_(self.params, self.unflat(delta.to(self.dtype)), alpha=scale)
