"""A step's batch as its passes see it: split into micro-batches, and the rows a pass keeps."""

from __future__ import annotations

import torch

from ..optim.engine import SharpnessAware


def micro_batches(accumulate: int, *tensors: torch.Tensor) -> list[tuple]:
    """The step's tensors (inputs, loss targets, labels, indices) in ``accumulate`` micro-batches,
    the empty ones left out (a batch smaller than ``accumulate``)."""
    if accumulate == 1:  # the tensors themselves: no split (one op per tensor) every step
        return [tensors] if tensors[2].shape[0] else []
    parts = (t.tensor_split(accumulate) for t in tensors)
    return [m for m in zip(*parts) if len(m[2])]


def selected_rows(optimizer: SharpnessAware, micro: list[tuple]) -> list:
    """(the micro-batch's place in the step, its kept tensors, the kept rows or None for all)
    for the micro-batches with a row left in the optimizer's current pass (ESAM's descent pass
    keeps the samples whose loss rose most)."""
    if type(optimizer).select_rows is SharpnessAware.select_rows:  # every row, every pass
        return [(j, m, None) for j, m in enumerate(micro)]
    out = []
    for j, m in enumerate(micro):
        ys = m[2]
        *kept, rows = optimizer.select_rows(*m, torch.arange(len(ys), device=ys.device))
        if len(rows):
            out.append((j, tuple(kept), None if len(rows) == len(ys) else rows))
    return out
