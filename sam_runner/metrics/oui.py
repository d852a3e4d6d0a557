"""The Overfitting-Underfitting Indicator (OUI; Fernández-Hernández et al. 2025), batch-based.

For one layer's activations ``[B, ...]`` a unit is one entry of a sample's flattened activation
(for a convolution output ``[B, C, H, W]``: every (channel, position), as the authors' collector
flattens it). With s_j the number of the B samples on which unit j is positive (> 0), the unit's
score is min(s_j, B − s_j)/⌊B/2⌋: 0 for a unit that is on (or off) for the whole batch, 1 for
one that splits it in half. OUI is the mean over units: near 0 the layer acts linearly on the
batch (too much weight decay, underfitting); near 1 every unit separates the samples (too
little, overfitting).
"""

from __future__ import annotations

import torch

from ..errors import require


def oui(activations: torch.Tensor) -> float:
    """The batch-based OUI of one layer's activations ``[B, ...]`` (B ≥ 2)."""
    require(
        activations.ndim >= 2 and activations.shape[0] >= 2,
        f"oui needs activations [B, ...] with a batch of at least 2; "
        f"got {tuple(activations.shape)}",
    )
    b = activations.shape[0]
    positive = (activations.detach().reshape(b, -1) > 0).sum(dim=0)
    score = torch.minimum(positive, b - positive).double() / (b // 2)
    return float(score.mean())
