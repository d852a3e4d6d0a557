"""Complexity measures of the weights, in the definitions of Jiang et al. 2020 ("Fantastic
Generalization Measures and Where to Find Them", their equation numbers below), each of the
network as it predicts: BatchNorm is folded into the layer before it first (``fold_batchnorm``),
as their measures are taken, so that a BatchNorm scale does not hide in a weight norm.

- ``param_norm`` (eq. 42): Σ_l ‖W_l‖²_F over the conv and linear weight tensors (no biases).
- ``dist_from_init`` (eq. 40): Σ_l ‖W_l − W_l⁰‖²_F, θ⁰ the weights a run starts from (saved at
  step 0 in ``checkpoints/init.pt``); absent for a run folder from before that file existed.
- ``path_norm`` (eq. 44): Σ f_{w²}(1): every parameter squared, the all-ones input, the outputs
  summed (on a ReLU network, the sum over input–output paths of the squared weights' product).
- ``spectral_norm_product`` (eq. 32, "log prod of spec"): log Π_l ‖W_l‖²₂ = Σ_l 2 log σ_max(W_l),
  a conv kernel [out, in, k…] taken as the [out, in·k…] matrix (the approximation Jiang et al.
  use; the exact operator norm of a convolution depends on the input size). Reported as the log,
  as they do: the product itself overflows on deep networks.

Our choices: Jiang et al. also scale every measure by the training-set size (√(value/m), or
½(value − log m) for log measures); we report them unscaled, which changes no ranking within a
dataset. The fold matches a BatchNorm to the conv or linear layer registered just before it
when its feature count equals that layer's output count (true of every model of this package);
a BatchNorm with no such layer is left in place.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

if TYPE_CHECKING:
    from collections.abc import Sequence

LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _outputs(layer) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


@torch.no_grad()
def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy in eval mode computing the same function with every BatchNorm folded into the layer
    before it (that BatchNorm then the identity: weight 1, bias 0, mean 0, variance 1 − eps)."""
    folded = copy.deepcopy(model).eval()
    previous = None
    for module in folded.modules():
        if isinstance(module, LAYERS):
            previous = module
        elif isinstance(module, _BatchNorm) and previous is not None:
            if module.running_var is None or module.num_features != _outputs(previous):
                continue
            scale = torch.ones_like(module.running_var) if module.weight is None else module.weight
            scale = scale / (module.running_var + module.eps).sqrt()
            shift = torch.zeros_like(scale) if module.bias is None else module.bias
            bias = previous.bias if previous.bias is not None else torch.zeros_like(scale)
            new_bias = shift + scale * (bias - module.running_mean)
            shape = (-1,) + (1,) * (previous.weight.dim() - 1)
            previous.weight.mul_(scale.view(shape))
            previous.bias = nn.Parameter(new_bias.to(previous.weight.dtype))
            module.running_mean.zero_()
            module.running_var.fill_(1.0 - module.eps)  # (x − 0)/√(var + eps) = x
            if module.weight is not None:
                module.weight.fill_(1.0)
                module.bias.zero_()
            previous = None
    return folded


def layer_weights(model: nn.Module) -> dict:
    """The conv and linear weight tensors by module name."""
    return {n: m.weight for n, m in model.named_modules() if isinstance(m, LAYERS)}


@torch.no_grad()
def complexity_measures(
    model: nn.Module, input_shape: Sequence[int], init_state: dict | None = None
) -> dict:
    """The measures above (float64 sums) of ``model``; ``dist_from_init`` only with the
    ``init_state`` (a state_dict of the same architecture) the run started from."""
    folded = fold_batchnorm(model)
    weights = {n: w.double() for n, w in layer_weights(folded).items()}
    out = {
        "param_norm": sum(float(w.square().sum()) for w in weights.values()),
        "path_norm": path_norm(folded, input_shape),
        "spectral_norm_product": sum(
            2 * math.log(float(torch.linalg.matrix_norm(w.reshape(len(w), -1), ord=2)))
            for w in weights.values()
        ),
    }
    if init_state is not None:
        start = copy.deepcopy(model)
        start.load_state_dict(init_state)
        initial = layer_weights(fold_batchnorm(start))
        out["dist_from_init"] = sum(
            float((w - initial[n].double()).square().sum()) for n, w in weights.items()
        )
    return out


@torch.no_grad()
def path_norm(model: nn.Module, input_shape: Sequence[int]) -> float | None:
    """Σ f_{w²}(1): the model (eval mode) with every parameter squared, on one all-ones input;
    None for a model of token ids (an embedding layer, model=gpt: no all-ones input to give it)."""
    if any(isinstance(m, nn.Embedding) for m in model.modules()):
        return None
    squared = copy.deepcopy(model).eval()
    for p in squared.parameters():
        p.square_()
    p0 = next(squared.parameters())
    ones = torch.ones((1, *input_shape), dtype=p0.dtype, device=p0.device)
    return float(squared(ones).double().sum())
