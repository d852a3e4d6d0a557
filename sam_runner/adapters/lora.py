"""Low-rank adapters (LoRA, Hu et al. 2022) on Linear and Conv layers, written for the runner.

An adapted layer computes ``W x + b + (α/r)·B A dropout(x)`` with A ∈ ℝ^{r×d_in} (Kaiming-uniform,
a = √5, as torch initialises a Linear), B ∈ ℝ^{d_out×r} (zeros: the adapted model starts as the
pretrained one). A convolution's A is a convolution with the layer's kernel, stride, padding and
dilation into r channels, its B a 1×1 convolution from r channels (what the ``peft`` library does,
which tests/test_lora.py compares against).

The layer stays the module it was: its class becomes a subclass of its own class (``LoRALinear``
of ``nn.Linear``, and so on), so its weight and bias keep their names in the state dict
(``fc1.0.weight``) and the adapters sit beside them (``fc1.0.lora_A``, ``fc1.0.lora_B``);
``isinstance(layer, nn.Linear)`` still holds for everything that reads the model's structure
(parameter groups, Muon's hidden matrices, the classifier's name).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.conv import _ConvNd

ADAPTABLE = (nn.Linear, nn.Conv1d, nn.Conv2d)


class LoRA:
    """The adapter half of an adapted layer (mixed into a subclass of the layer's own class)."""

    lora_A: nn.Parameter
    lora_B: nn.Parameter

    def add_adapter(self, rank: int, alpha: float, dropout: float) -> None:
        """Adds A (Kaiming-uniform) and B (zeros) of rank ``rank``, scaled by ``alpha / rank``."""
        self.lora_rank, self.lora_alpha = int(rank), float(alpha)
        self.lora_scaling = self.lora_alpha / self.lora_rank
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        w = self.weight
        like = dict(device=w.device, dtype=w.dtype)
        if isinstance(self, nn.Linear):
            a_shape, b_shape = (rank, self.in_features), (self.out_features, rank)
        else:
            a_shape = (rank, self.in_channels, *self.kernel_size)
            b_shape = (self.out_channels, rank, *([1] * len(self.kernel_size)))
        self.lora_A = nn.Parameter(torch.empty(a_shape, **like))
        self.lora_B = nn.Parameter(torch.zeros(b_shape, **like))
        if w.device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def lora_delta(self, x: torch.Tensor) -> torch.Tensor:
        """(α/r)·B A dropout(x), in the layer's output shape."""
        h = self.lora_dropout(x)
        if isinstance(self, nn.Linear):
            return F.linear(F.linear(h, self.lora_A), self.lora_B) * self.lora_scaling
        # A: the layer's own convolution (stride, padding, its mode, dilation) into r channels
        h = self._conv_forward(h, self.lora_A, None)
        conv = F.conv1d if isinstance(self, nn.Conv1d) else F.conv2d
        return conv(h, self.lora_B) * self.lora_scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's own output plus the adapter's."""
        return super().forward(x) + self.lora_delta(x)

    def extra_repr(self) -> str:
        """The layer's own, with the rank and alpha."""
        return f"{super().extra_repr()}, lora_rank={self.lora_rank}, lora_alpha={self.lora_alpha:g}"


_CLASSES: dict[type, type] = {}


def lora_class(layer_type: type) -> type:
    """``LoRA<Layer>``: the layer's own class with adapters (one class per layer class)."""
    if layer_type not in _CLASSES:
        _CLASSES[layer_type] = type(f"LoRA{layer_type.__name__}", (LoRA, layer_type), {})
    return _CLASSES[layer_type]


def max_rank(layer: nn.Module) -> int:
    """The largest rank an adapter of ``layer`` can have: min(d_in, d_out) of its matrix (a
    convolution's d_in is in_channels × kernel size)."""
    if isinstance(layer, nn.Linear):
        return min(layer.in_features, layer.out_features)
    return min(layer.in_channels * math.prod(layer.kernel_size), layer.out_channels)


def adaptable(layer: nn.Module) -> bool:
    """A Linear, Conv1d or Conv2d (groups 1) not adapted yet."""
    if not isinstance(layer, ADAPTABLE) or isinstance(layer, LoRA):
        return False
    return not isinstance(layer, _ConvNd) or layer.groups == 1


def add_lora(layer: nn.Module, rank: int, alpha: float, dropout: float = 0.0) -> nn.Module:
    """Turn ``layer`` into its adapted class in place (its weights untouched) and add the
    adapters; returns it."""
    layer.__class__ = lora_class(type(layer))
    layer.add_adapter(rank, alpha, dropout)
    return layer
