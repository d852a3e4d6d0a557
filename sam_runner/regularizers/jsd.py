"""``regularizer=jsd``: the α-skew Jensen–Shannon divergence between the predictions at θ and at a
perturbed point (docs/regularizers.md)."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch
from torch.func import functional_call

from ..errors import number, require
from ..losses import skew_jsd
from ..module_state import is_trainable
from ..part import Part, PassInputs
from ..registry import REGULARIZERS

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig
    from torch import nn

SPACES = ("parameter", "input")


class SkewJSD(Part):
    """weight·mean JSD_α(p(x; θ) ‖ p(x̃; θ̃)) with a perturbed second forward: θ̃ = θ + δ (a fresh
    Gaussian direction of norm ``radius`` over all trainable parameters) or x̃ = x + radius·N(0, 1).
    The second forward runs on copies of the buffers, so BatchNorm's running statistics are
    those of the training forward alone; its noise comes from torch's generator, which the
    checkpoint holds, so a resumed run draws alike. ``detach``: the perturbed prediction is a
    fixed target (its forward without gradients: one extra forward a pass and no backward through
    it) instead of a second path of the gradient to θ."""

    extra_forwards = 1

    def __init__(
        self,
        alpha: float,
        weight: float,
        space: str,
        radius: float,
        autocast: AbstractContextManager | None = None,
        detach: bool = False,
    ) -> None:
        self.alpha, self.weight, self.space, self.radius = alpha, weight, space, radius
        self.autocast, self.detach = autocast, detach

    def perturbed_inputs(
        self, model: nn.Module, x: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(parameters and buffers of the second forward, its input)."""
        params = {n: p for n, p in model.named_parameters()}
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        if self.space == "input":
            return {**params, **buffers}, x + self.radius * torch.randn_like(x)
        trainable = [n for n, p in params.items() if is_trainable(p)]  # ESAM may skip some
        with torch.no_grad():
            z = {n: torch.randn_like(params[n]) for n in trainable}
            norm = torch.linalg.vector_norm(torch.stack([v.norm() for v in z.values()]))
            scale = self.radius / (norm + 1e-12)
        shifted = {n: params[n] + z[n] * scale for n in trainable}  # out of place: grads reach θ
        return {**params, **shifted, **buffers}, x

    def divergence(self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The mean α-skew JSD of this micro-batch (before the weight)."""
        with torch.no_grad() if self.detach else contextlib.nullcontext():
            state, x2 = self.perturbed_inputs(model, x)
            with self.autocast or contextlib.nullcontext():
                other = functional_call(model, state, (x2,))
        dtype = torch.promote_types(logits.dtype, torch.float32)  # half precision: in float32
        p, q = torch.softmax(logits.to(dtype), 1), torch.softmax(other.to(dtype), 1)
        return skew_jsd(p, q, self.alpha).mean()

    def loss_term(self, objective: torch.Tensor, inputs: PassInputs) -> torch.Tensor:
        """``objective`` plus the weighted divergence of the pass's micro-batch."""
        return self.add(objective, inputs.model, inputs.inputs, inputs.logits, inputs.share)

    def add(
        self,
        loss: torch.Tensor,
        model: nn.Module,
        x: torch.Tensor,
        logits: torch.Tensor,
        share: float,
    ) -> torch.Tensor:
        """``loss`` plus weight · share · the divergence (unchanged on a forward no gradient
        flows from)."""
        if not logits.requires_grad:  # a forward no gradient flows from (ESAM's selection pass)
            return loss
        return loss + self.weight * share * self.divergence(model, x, logits)


def _keys(cfg) -> tuple:
    alpha = number("regularizer.alpha", cfg.get("alpha", 0.5), "a number in (0, 1)",
                   lambda a: 0 < a < 1)  # fmt: skip
    weight = number("regularizer.weight", cfg.get("weight", 1.0), "a finite number >= 0",
                    lambda w: 0 <= w < math.inf)  # fmt: skip
    space = cfg.get("space", "parameter")
    require(space in SPACES, f"regularizer.space={space!r} is unknown; choose {', '.join(SPACES)}")
    radius = number("regularizer.radius", cfg.get("radius", 0.05), "a finite number >= 0",
                    lambda r: 0 <= r < math.inf)  # fmt: skip
    detach = cfg.get("detach", False)
    require(isinstance(detach, bool), f"regularizer.detach={detach!r} must be true or false")
    return alpha, weight, space, radius, detach


@REGULARIZERS.register("jsd", "+ weight·JSD_α(p(x; θ) ‖ p(x̃; θ̃)), θ or x perturbed")
def jsd(cfg: DictConfig, autocast: AbstractContextManager | None = None) -> SkewJSD | None:
    """The ``jsd`` regularizer, keys checked (None at weight 0: nothing added)."""
    alpha, weight, space, radius, detach = _keys(cfg)
    if weight == 0:
        return None  # nothing added: the plain run exactly, without the extra forward
    return SkewJSD(alpha, weight, space, radius, autocast, detach)
