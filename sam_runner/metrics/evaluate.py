"""Test-set evaluation: loss, accuracy, NLL and calibration over the whole test set.

Under data parallelism each process evaluates its shard; the logits and labels are
gathered first (``dist.gather``), so every number, ECE included, is over the whole test
set and never a mean of per-process values.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..losses import token_pairs
from .calibration import calibration_report, reliability_bins

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig
    from torch import nn

    from ..distributed import Topology


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    autocast: AbstractContextManager,
    dist: Topology,
    metrics_cfg: DictConfig,
    class_counts: Sequence[int] | None = None,
) -> dict:
    """The test_* keys of a metrics row, plus ``reliability`` (diagram bins, for summary.json
    only: the caller pops it out of the row). With ``metrics.class_splits`` set and the
    training set's per-class counts given, also the long-tail split accuracies."""
    logits, labels = predict(model, loader, autocast, dist)
    n_bins = int(metrics_cfg.get("ece_bins", 15))
    row = {
        "test_loss": float(criterion(logits, labels).mean()),
        "test_acc": float((logits.argmax(1) == labels).float().mean()),
    }
    row.update({f"test_{k}": v for k, v in calibration_report(logits, labels, n_bins).items()})
    row["reliability"] = reliability_bins(logits.softmax(dim=1), labels, n_bins)
    splits = metrics_cfg.get("class_splits")
    if splits and class_counts:
        row.update(
            split_accuracy(
                logits.argmax(1), labels, class_counts, int(splits["many"]), int(splits["few"])
            )
        )
    return row


@torch.no_grad()
def predict(
    model: nn.Module, loader: Iterable, autocast: AbstractContextManager, dist: Topology
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 logits, labels) of the whole set ``loader`` yields, in eval mode (the model's
    mode restored), gathered over data-parallel processes; a sequence model's, one row per
    predicted token (``losses.token_pairs``)."""
    was_training = model.training
    model.eval()
    logits, labels, x = [], [], None
    for x, y, _ in loader:
        with autocast:
            out, y = token_pairs(model(x).float(), y)
        logits.append(out)
        labels.append(y)
    if getattr(dist, "sharded", False):  # every forward of a sharded model is collective
        n = torch.tensor(len(logits), device=labels[0].device)
        for _ in range(int(dist.max(n)) - len(logits)):  # a shorter share: forwards to match
            with autocast:
                model(x[:1])
    model.train(was_training)
    return dist.gather(torch.cat(logits)), dist.gather(torch.cat(labels))


def token_values(loss: float, prefix: str = "test") -> dict:
    """Perplexity exp(loss) and bits per token loss/ln 2 (per byte on byte-level text) of a mean
    next-token loss in nats."""
    ppl = math.exp(loss) if loss < 700 else math.inf  # exp overflows a float beyond ~709
    return {f"{prefix}_ppl": ppl, f"{prefix}_bpc": loss / math.log(2)}


def split_accuracy(
    pred: torch.Tensor, labels: torch.Tensor, class_counts: Sequence[int], many: int, few: int
) -> dict:
    """Test accuracy over many-shot (> ``many`` training examples), medium-shot and few-shot
    (< ``few``) classes, the long-tail convention (100 and 20 on CIFAR-100-LT)."""
    counts = torch.as_tensor(class_counts, device=labels.device)[labels]
    correct = (pred == labels).float()
    out = {}
    for name, mask in (
        ("many", counts > many),
        ("medium", (counts <= many) & (counts >= few)),
        ("few", counts < few),
    ):
        out[f"test_acc_{name}"] = float(correct[mask].mean()) if bool(mask.any()) else None
    return out
