"""Calibration metrics on ``[N, C]`` probabilities and ``[N]`` integer labels."""
from __future__ import annotations

import torch


def _bin_stats(probs: torch.Tensor, labels: torch.Tensor, n_bins: int):
    """Per-bin (count, mean confidence, accuracy) over equal-width top-label confidence bins.

    Bins are (k/n, (k+1)/n], as torchmetrics' bucketize(right=True) - 1 assigns them:
    a confidence exactly on an edge falls in the lower bin.
    """
    conf, pred = probs.float().max(dim=1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, n_bins + 1, device=probs.device)
    idx = (torch.bucketize(conf, edges, right=True) - 1).clamp(0, n_bins - 1)
    # torchmetrics computes bucketize on the lower-inclusive grid; reproduce its assignment exactly
    count = torch.zeros(n_bins, device=probs.device).scatter_add_(0, idx, torch.ones_like(conf))
    conf_sum = torch.zeros(n_bins, device=probs.device).scatter_add_(0, idx, conf)
    acc_sum = torch.zeros(n_bins, device=probs.device).scatter_add_(0, idx, correct)
    return count, conf_sum, acc_sum


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Top-label ECE with ``n_bins`` equal-width bins, L1: Σ_b (n_b/N) |acc_b − conf_b|."""
    count, conf_sum, acc_sum = _bin_stats(probs, labels, n_bins)
    return float((conf_sum - acc_sum).abs().sum() / count.sum().clamp_min(1))


def reliability_bins(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> dict:
    """Per-bin confidence, accuracy and count (for reliability diagrams)."""
    count, conf_sum, acc_sum = _bin_stats(probs, labels, n_bins)
    nz = count.clamp_min(1)
    return {"confidence": (conf_sum / nz).tolist(), "accuracy": (acc_sum / nz).tolist(),
            "count": count.long().tolist()}
