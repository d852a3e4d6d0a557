"""Forward passes replaced, inside a curvature measurement only, by the same functions in a form
whose second derivatives are cheaper (ours; none changes the function):

- BatchNorm in eval mode as the affine map it is, x·(γ/√(σ²+ε)) + (β − μγ/√(σ²+ε)): its double
  backward is cheaper than batch_norm's general one (~15% of an HVP on the default model);
- on a CPU, Conv1d as unfold + one matrix product (~25% of an HVP on the default model).

Per-sample gradients (``torch.func.vmap``) undo the second one (``own_conv1d``): vmap has no
batching rule for unfold's backward and runs it sample by sample, while conv1d's own batches.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..module_state import own_forwards

if TYPE_CHECKING:
    from contextlib import AbstractContextManager


def _affine_batchnorm_forward(self, x):
    scale = torch.rsqrt(self.running_var + self.eps)
    if self.affine:
        scale = self.weight * scale
    shift = -self.running_mean * scale + (self.bias if self.affine else 0)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return torch.addcmul(shift.view(shape), x, scale.view(shape))


@contextlib.contextmanager
def _forwards_replaced(modules, forward):
    """Each module's ``forward`` is ``forward`` bound to it, until the context closes."""
    for m in modules:
        m.forward = forward.__get__(m)
    try:
        yield
    finally:
        for m in modules:
            del m.forward


def _own_forward(m, cls) -> bool:
    """``m`` runs ``cls.forward``: not a subclass's override, not already replaced."""
    return type(m).forward is cls.forward and "forward" not in m.__dict__


def affine_eval_batchnorm(model: nn.Module) -> AbstractContextManager[None]:
    """Plain BatchNorm layers in eval mode (running statistics) computed as their affine map:
    the same function of the input and of γ, β, with cheaper second derivatives. Subclasses that
    override ``forward`` (e.g. timm's BatchNormAct2d) are left alone."""
    bns = [
        m
        for m in model.modules()
        if isinstance(m, _BatchNorm)
        and not m.training
        and m.running_mean is not None
        and _own_forward(m, _BatchNorm)
    ]
    return _forwards_replaced(bns, _affine_batchnorm_forward)


def _matmul_conv1d_forward(self, x):
    if x.dim() != 3:  # unbatched input: the module's own path
        return nn.Conv1d.forward(self, x)
    (k,), (stride,), (pad,) = self.kernel_size, self.stride, self.padding
    cols = F.pad(x, (pad, pad)).unfold(-1, k, stride)  # [B, C, L_out, k]
    b, c, length, _ = cols.shape
    out = (
        cols.transpose(1, 2).reshape(b * length, c * k)
        @ self.weight.view(self.out_channels, c * k).T
    )
    if self.bias is not None:
        out = out + self.bias
    return out.view(b, length, -1).transpose(1, 2)


def matmul_conv1d(model: nn.Module) -> AbstractContextManager[None]:
    """On a CPU, plain Conv1d layers (groups 1, dilation 1, zero padding) computed as unfold and
    one matrix product: the same function, whose second derivatives are matrix products too.
    oneDNN's 1-D convolution double backward is slower (default model: ~1.35× an HVP on one
    thread); for Conv2d it is the other way round (ResNet-18: unfold 1.7× slower), so Conv2d
    is left alone, as are subclasses that override ``forward``."""
    convs = [
        m
        for m in model.modules()
        if isinstance(m, nn.Conv1d)
        and _own_forward(m, nn.Conv1d)
        and m.weight.device.type == "cpu"
        and m.groups == 1
        and m.dilation == (1,)
        and m.padding_mode == "zeros"
        and isinstance(m.padding, tuple)
    ]
    return _forwards_replaced(convs, _matmul_conv1d_forward)


def own_conv1d(model: nn.Module):
    """The Conv1d layers that ``matmul_conv1d`` replaced run their own forward again until the
    context closes (the same function; under ``vmap`` the matrix form falls back to a loop over
    the samples: the default model's per-sample gradients take ~4× longer)."""
    return own_forwards(model, _matmul_conv1d_forward)
