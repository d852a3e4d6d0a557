"""Test-set evaluation: loss, accuracy, NLL and calibration over the whole test set."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .calibration import expected_calibration_error


@torch.no_grad()
def evaluate(model, loader, criterion, autocast, dist, metrics_cfg) -> dict:
    was_training = model.training
    model.eval()
    logits, labels = [], []
    for x, y, _ in loader:
        with autocast:
            logits.append(model(x).float())
        labels.append(y)
    model.train(was_training)
    logits, labels = dist.gather(torch.cat(logits)), dist.gather(torch.cat(labels))
    probs = logits.softmax(dim=1)
    n_bins = int(metrics_cfg.get("ece_bins", 15))
    return {
        "test_loss": float(criterion(logits, labels).mean()),
        "test_acc": float((logits.argmax(1) == labels).float().mean()),
        "test_ece": expected_calibration_error(probs, labels, n_bins),
        "test_nll": float(F.cross_entropy(logits, labels)),
    }
