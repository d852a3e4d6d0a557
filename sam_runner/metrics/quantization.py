"""Robustness to weight quantization (``metrics.quantization``): the test set evaluated with the
conv and linear weights rounded to ``bits`` bits, and the loss rise a second-order model predicts.

``quantize_weights(model, bits)``: a copy whose conv and linear weights are rounded per output
channel c, symmetric, to nearest: scale_c = max|w_c| / (2^(bits−1) − 1),
w' = clamp(round(w/scale_c), −(2^(bits−1) − 1), 2^(bits−1) − 1) · scale_c; biases, normalization
layers and buffers untouched. The arithmetic is PyTorch's fake quantization
(``torch.fake_quantize_per_channel_affine`` with zero point 0: w·(1/scale), rounded half to
even), so the two agree to the bit. A channel of zeros keeps scale 1 (it stays zero).

Keys for each b of ``bits``: ``quant_acc_<b>bit``, ``quant_loss_<b>bit``, ``quant_ece_<b>bit``,
``quant_drop_<b>bit`` = test_acc − quant_acc_<b>bit, ``quant_loss_rise_<b>bit`` (the measured
test-loss rise), and ``quant_loss_rise_pred_<b>bit`` = Σ_i H_ii s_i²/24: the expected rise of the
training loss, to second order at a stationary point, when each weight's rounding error is uniform
on [−s_i/2, s_i/2] (s_i its channel's scale; E δ² = s²/12, times ½H_ii), with H_ii of the
measurement subset — exact up to ``exact_max_params`` parameters, else Hutchinson with
``num_probes`` probes. Each bit width costs one test pass (the clean pass is shared).
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from .complexity import LAYERS

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from .hvp import HessianOperator
    from .solvers import SeededProbes


def _scales(weight: torch.Tensor, bits: int) -> torch.Tensor:
    levels = 2 ** (bits - 1) - 1
    top = weight.detach().reshape(len(weight), -1).abs().amax(1) / levels
    return torch.where(top > 0, top, torch.ones_like(top)).float()


@torch.no_grad()
def quantize_weights(model: nn.Module, bits: int) -> nn.Module:
    """A copy of ``model`` with its conv and linear weights quantized (module docstring)."""
    if not (isinstance(bits, int) and 2 <= bits <= 16):
        raise ValueError(f"bits={bits!r} must be an integer in 2..16")
    levels = 2 ** (bits - 1) - 1
    out = copy.deepcopy(model)
    for module in out.modules():
        if isinstance(module, LAYERS):
            w = module.weight
            scale = _scales(w, bits).to(w.device)
            shape = (-1,) + (1,) * (w.dim() - 1)
            inverse = (1.0 / scale).view(shape)
            q = torch.clamp(torch.round(w.float() * inverse), -levels, levels)
            w.copy_((q * scale.view(shape)).to(w.dtype))
    return out


def rounding_steps(model: nn.Module, params: Sequence[torch.Tensor], bits: int) -> list:
    """For each tensor of ``params`` (the Hessian operator's), the rounding step of each entry:
    its channel's scale for a conv or linear weight, 0 for everything else."""
    scales = {id(m.weight): m.weight for m in model.modules() if isinstance(m, LAYERS)}
    out = []
    for p in params:
        if id(p) in scales:
            s = _scales(p, bits).to(p.device, p.dtype)
            out.append(s.view((-1,) + (1,) * (p.dim() - 1)).expand_as(p))
        else:
            out.append(torch.zeros_like(p))
    return out


def predicted_rise(
    op: HessianOperator,
    model: nn.Module,
    bits: Iterable[int],
    exact_max_params: int,
    num_probes: int,
    seed: int,
    probes: SeededProbes | None = None,
) -> dict:
    """{b: Σ_i H_ii s_i²/24} on the operator's loss for each b of ``bits`` (module docstring):
    one diagonal (exact, or Hutchinson's z ⊙ Hz over one set of probes) for every bit width.
    ``probes``: a ``SeededProbes`` of ``op`` and ``seed`` (HVPs shared with the trace)."""
    from .solvers import hessian_diagonal, probe_products

    if op.numel <= exact_max_params:
        diagonal = hessian_diagonal(op)
    else:
        V, HV = probe_products(op, num_probes, seed, probes)
        diagonal = (V * HV).double().mean(0)
    out = {}
    for b in bits:
        weight = op.flat(rounding_steps(model, op.params, b)).double().square() / 24
        out[b] = float(torch.dot(weight.to(diagonal.device), diagonal))
    return out


def quantization_values(
    model: nn.Module, test: Iterable, bits: Iterable[int], ece_bins: int = 15
) -> dict:
    """The test-set keys (module docstring) for every bit width of ``bits``."""
    from .. import distributed
    from .calibration import expected_calibration_error
    from .evaluate import predict

    dist, plain = distributed.current(), contextlib.nullcontext()

    def scores(net):
        logits, labels = predict(net, test, plain, dist)
        loss = float(nn.functional.cross_entropy(logits, labels))
        acc = float((logits.argmax(1) == labels).float().mean())
        return acc, loss, float(expected_calibration_error(logits.softmax(1), labels, ece_bins))

    acc, loss, _ = scores(model)
    out = {}
    for b in bits:
        q_acc, q_loss, q_ece = scores(quantize_weights(model, int(b)))
        out.update(
            {
                f"quant_acc_{b}bit": q_acc,
                f"quant_loss_{b}bit": q_loss,
                f"quant_ece_{b}bit": q_ece,
                f"quant_drop_{b}bit": acc - q_acc,
                f"quant_loss_rise_{b}bit": q_loss - loss,
            }
        )
    return out
