"""``input_grad_norm`` (``metrics.input_grad``): the mean over test samples of ‖∇ₓ ℓ(f(x), y)‖₂,
the per-sample input gradient of the cross-entropy, in eval mode and float32.

In eval mode a sample's output depends on its own input only, so the gradient of the batch's
summed loss with respect to the batch's inputs holds each sample's own input gradient in its row:
one backward per batch gives every per-sample norm (a per-sample loop gives the same numbers; the
test compares). Under data parallelism the mean is over every process's shard.
``num_samples``: the first that many test samples (all by default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..module_state import modes_restored

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch import nn


def input_grad_norm(
    model: nn.Module, batches: Iterable[tuple], num_samples: int | None = None
) -> float:
    """Mean per-sample ‖∇ₓ ℓ‖₂ over the (x, y, …) ``batches`` (their first ``num_samples``)."""
    from .. import distributed

    total, count = 0.0, 0
    with modes_restored(model):
        model.eval()
        for batch in batches:
            x, y = batch[0], batch[1]
            if num_samples is not None:
                x, y = x[: num_samples - count], y[: num_samples - count]
            if len(y) == 0:
                break
            x = x.detach().float().requires_grad_(True)
            with torch.enable_grad():
                loss = F.cross_entropy(model(x).float(), y, reduction="sum")
                (grad,) = torch.autograd.grad(loss, x)
            total += float(grad.reshape(len(y), -1).norm(dim=1).double().sum())
            count += len(y)
    # data parallel: each process holds a shard of the test set; the mean is over all of them
    device = next(model.parameters()).device
    pair = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    sums = distributed.current().sum(pair)
    total, count = float(sums[0]), int(sums[1])
    if count == 0:
        raise ValueError("input_grad_norm: no test sample to measure")
    return total / count
