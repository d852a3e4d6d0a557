"""The Overfitting-Underfitting Indicator (OUI; Fernández-Hernández et al. 2025), batch-based.

For one layer's activations ``[B, ...]`` a unit is one entry of a sample's flattened activation
(``oui`` flattens whatever it is given; the ``weight_decay=ouidecay`` collector hands it one
sampled position per sample and channel of a convolution output, as the authors' collector
does: see sam_runner/weight_decay.py). With s_j the number of the B samples on which unit j is
positive (> 0), the unit's score is min(s_j, B − s_j)/⌊B/2⌋: 0 for a unit that is on (or off)
for the whole batch, 1 for one that splits it in half. OUI is the mean over units: near 0 the
layer acts linearly on the batch (too much weight decay, underfitting); near 1 every unit
separates the samples (too little, overfitting).
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
    return float(oui_from_counts(positive, b))


def oui_from_counts(positive: torch.Tensor, batch: int | torch.Tensor) -> torch.Tensor:
    """OUI from the per-unit counts of positive samples ``positive`` over a batch of ``batch``
    (a number or a 0-d tensor): the mean of min(s_j, B − s_j)/⌊B/2⌋, as a float64 0-d tensor on
    the counts' device (no host sync; counts summed over micro-batches and processes give the
    OUI of the whole batch)."""
    b = torch.as_tensor(batch, device=positive.device).double()
    positive = positive.double()
    return (torch.minimum(positive, b - positive) / torch.floor(b / 2)).mean()
