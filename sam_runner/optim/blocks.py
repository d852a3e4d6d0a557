"""A model's structure as the optimizers read it: functional blocks and hidden matrices.

- Block of a parameter: the model's top-level child that owns it (normalisation layers sit
  inside the block of the layer they follow); parameters held by the root module itself
  form one extra block, ``root``. A model may name its blocks itself (``parameter_blocks()``:
  a Hugging Face model's embeddings, each of its layers, and the rest, models/hf.py).
- Hidden: the weights of Linear and Conv layers (``transformers``' ``Conv1D`` among them),
  except the first and the last such layer in module order (the input layer and the classifier
  head, as Muon does). Nothing else is hidden: embeddings, tokens, position embeddings,
  normalisation weights and biases.
  A hidden layer's LoRA factors (``model.peft=lora``) are hidden too: they are that layer's
  trainable matrices, so LoRA under ``base_optimizer=muon`` is Muon on the adapters (our choice;
  otherwise every trained parameter of a LoRA run would fall to Muon's AdamW).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.nn.modules.conv import _ConvNd

if TYPE_CHECKING:
    import torch

ROOT = "root"


def is_bias(name: str, p: torch.Tensor) -> bool:
    """A bias: a vector whose name ends in ``bias``. Everything else, normalisation weights
    included, is a weight (ASAM's T = |θ| + η, the runner's ``kind`` of a parameter group)."""
    return p.ndim <= 1 and name.endswith("bias")


def top_level_blocks(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> block name`` for every parameter of ``model`` (a model that names its
    blocks itself, ``parameter_blocks()``, is read that way: ``model=hf``'s)."""
    own = getattr(model, "parameter_blocks", None)
    if callable(own):
        return own()
    owner = {id(p): name for name, child in model.named_children() for p in child.parameters()}
    for p in model.parameters(recurse=False):
        owner.setdefault(id(p), ROOT)
    return owner


def _matrix_layer(m: nn.Module) -> bool:
    """A Linear or Conv layer, or ``transformers``' ``Conv1D`` (GPT-2's linear layers, their
    weight stored [in, out])."""
    return isinstance(m, (nn.Linear, _ConvNd)) or type(m).__name__ == "Conv1D"


def hidden_weights(model: nn.Module) -> set[int]:
    """``id``s of the hidden weights: Linear/Conv weights but the first and the last such
    layer's."""
    layers = [m for m in model.modules() if _matrix_layer(m) and m.weight is not None]
    factors = lambda m: [getattr(m, k) for k in ("lora_A", "lora_B") if hasattr(m, k)]
    return {id(p) for m in layers[1:-1] for p in (m.weight, *factors(m))}
