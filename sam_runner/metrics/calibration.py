"""Calibration metrics on ``[N, C]`` probabilities and ``[N]`` integer labels.

Top-label confidence c_i = max_k p_ik, prediction argmax, a_i = 1 if right.

- ``expected_calibration_error``: Σ_b (n_b/N) |acc_b − conf_b| over equal-width bins. The
  binning is torchmetrics' (``MulticlassCalibrationError(norm="l1")``) so the two agree
  exactly: bin b holds confidences in [b/n, (b+1)/n) (``bucketize(right=True) - 1``), so a
  confidence exactly on an inner edge opens the upper bin, and a confidence of exactly
  1.0 gets a bin of its own (torchmetrics allocates n+1 slots; we keep that).
- ``adaptive_calibration_error``: the same sum over equal-mass bins (sorted confidences
  cut into n nearly equal chunks; Nguyen & O'Connor 2015, Nixon et al. 2019). Exactly tied
  confidences all go to the bin of the first of them (our choice: otherwise the cut through a
  tie, and so the value, would depend on the order of the samples), so bins may be unequal
  or empty where there are ties.
- ``maximum_calibration_error``: max over non-empty equal-width bins of |acc_b − conf_b|.
- ``brier_score``: mean over samples of Σ_k (p_ik − 1[k = y_i])² (the multi-class form,
  range [0, 2]).
- ``reliability_bins``: per-bin mean confidence, accuracy and count for a reliability
  diagram (the 1.0 slot folded into the last bin so there are exactly n bins).

Everything is computed in float32 from the gathered whole-test-set tensors.
"""

from __future__ import annotations

import torch

from ..errors import require


def _top_label(probs: torch.Tensor, labels: torch.Tensor):
    require(
        probs.dim() == 2 and labels.dim() == 1 and len(probs) == len(labels),
        f"calibration needs probs [N, C] and labels [N], got {tuple(probs.shape)} and "
        f"{tuple(labels.shape)}",
    )
    conf, pred = probs.max(dim=1)
    return conf.float(), pred.eq(labels).float()


def _check_bins(n_bins) -> int:
    require(isinstance(n_bins, int) and n_bins >= 1, f"n_bins={n_bins!r} must be an integer >= 1")
    return n_bins


def _equal_width_sums(conf: torch.Tensor, correct: torch.Tensor, n_bins: int):
    """(count, confidence sum, correct sum) over n_bins + 1 slots, binned as torchmetrics does."""
    edges = torch.linspace(0, 1, n_bins + 1, dtype=conf.dtype, device=conf.device)
    idx = torch.bucketize(conf, edges, right=True) - 1
    zeros = lambda: torch.zeros(n_bins + 1, dtype=conf.dtype, device=conf.device)
    return (
        zeros().scatter_add_(0, idx, torch.ones_like(conf)),
        zeros().scatter_add_(0, idx, conf),
        zeros().scatter_add_(0, idx, correct),
    )


def expected_calibration_error(
    probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15
) -> float:
    """Top-label L1 ECE with ``n_bins`` equal-width bins (equal to torchmetrics')."""
    conf, correct = _top_label(probs, labels)
    count, conf_sum, acc_sum = _equal_width_sums(conf, correct, _check_bins(n_bins))
    return float((conf_sum - acc_sum).abs().sum() / count.sum().clamp_min(1))


def maximum_calibration_error(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """The largest gap |confidence − accuracy| over equal-width confidence bins (empty bins: 0)."""
    conf, correct = _top_label(probs, labels)
    count, conf_sum, acc_sum = _equal_width_sums(conf, correct, _check_bins(n_bins))
    gap = (conf_sum - acc_sum).abs() / count.clamp_min(1)
    return float(gap.max())  # empty bins have gap 0


def adaptive_calibration_error(
    probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15
) -> float:
    """L1 ECE over equal-mass bins: sorted confidences cut into ``n_bins`` near-equal chunks."""
    conf, correct = _top_label(probs, labels)
    n = len(conf)
    if n == 0:
        return 0.0
    if not torch.isfinite(conf).all():  # a diverged model: no bin to put a NaN in
        return float("nan")
    conf, order = conf.sort(stable=True)
    # bin of the i-th smallest confidence: floor(i * n_bins / n) (sizes differ by at most 1), with i
    # the rank of the first of its ties, so that a tie is never split
    first = torch.searchsorted(conf, conf, side="left")
    bin_id = first * _check_bins(n_bins) // n
    diff = torch.zeros(n_bins, dtype=conf.dtype, device=conf.device)
    diff.scatter_add_(0, bin_id, conf - correct[order])
    return float(diff.abs().sum() / n)


def brier_score(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean over samples of ‖p − onehot(y)‖²."""
    p = probs.float()
    onehot = torch.nn.functional.one_hot(labels, p.shape[1]).to(p.dtype)
    return float((p - onehot).pow(2).sum(dim=1).mean())


def reliability_bins(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> dict:
    """Per-bin mean confidence, accuracy and count (equal-width; empty bins report 0)."""
    conf, correct = _top_label(probs, labels)
    count, conf_sum, acc_sum = _equal_width_sums(conf, correct, _check_bins(n_bins))
    fold = lambda t: torch.cat([t[: n_bins - 1], t[n_bins - 1 :].sum(0, keepdim=True)])
    count, conf_sum, acc_sum = fold(count), fold(conf_sum), fold(acc_sum)
    nz = count.clamp_min(1)
    # float64 for the JSON (float32's 1/15 is 0.0666666716)
    edges = [i / n_bins for i in range(n_bins + 1)]
    return {
        "edges": edges,
        "confidence": (conf_sum / nz).tolist(),
        "accuracy": (acc_sum / nz).tolist(),
        "count": count.long().tolist(),
    }


def calibration_report(logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> dict:
    """Every calibration number from logits, keyed as the metrics rows name them."""
    logits = logits.float()
    probs = logits.softmax(dim=1)
    return {
        "ece": expected_calibration_error(probs, labels, n_bins),
        "ece_adaptive": adaptive_calibration_error(probs, labels, n_bins),
        "mce": maximum_calibration_error(probs, labels, n_bins),
        "brier": brier_score(probs, labels),
        "nll": float(torch.nn.functional.cross_entropy(logits, labels)),
    }
