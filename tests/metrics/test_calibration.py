"""Calibration metrics against torchmetrics and closed forms, edge cases included."""

import math

import pytest
import torch
from torchmetrics.classification import MulticlassCalibrationError

from sam_runner.errors import UserError
from sam_runner.metrics import (
    adaptive_calibration_error,
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
)


def reference(probs, labels, n_bins=15, norm="l1"):
    m = MulticlassCalibrationError(num_classes=probs.shape[1], n_bins=n_bins, norm=norm)
    return float(m(probs, labels))


def random_case(n=500, c=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = (torch.randn(n, c, generator=g) * 3).softmax(1)
    return probs, torch.randint(0, c, (n,), generator=g)


@pytest.mark.parametrize("n_bins", [1, 10, 15])
def test_ece_equals_torchmetrics_on_random_predictions(n_bins):
    probs, labels = random_case()
    assert expected_calibration_error(probs, labels, n_bins) == pytest.approx(
        reference(probs, labels, n_bins), abs=1e-6
    )
    assert maximum_calibration_error(probs, labels, n_bins) == pytest.approx(
        reference(probs, labels, n_bins, "max"), abs=1e-6
    )


def test_confidence_exactly_on_bin_edges_and_at_one():
    # top-label confidences 0.2, 0.4, 0.6, 0.8 and 1.0 lie exactly on edges of 5 and 10 bins
    conf = torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0, 0.6])
    probs = torch.stack([conf, 1 - conf], 1)
    labels = torch.tensor([0, 1, 0, 0, 0, 1])
    for n_bins in (5, 10, 15):
        assert expected_calibration_error(probs, labels, n_bins) == pytest.approx(
            reference(probs, labels, n_bins), abs=1e-6
        )


def test_all_predictions_right_and_one_class():
    probs = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.55, 0.45]])
    labels = torch.zeros(3, dtype=torch.long)
    expected = ((1 - 0.9) + (1 - 0.7) + (1 - 0.55)) / 3  # each sample alone in its bin
    assert expected_calibration_error(probs, labels) == pytest.approx(expected, abs=1e-6)
    assert expected_calibration_error(probs, labels) == pytest.approx(
        reference(probs, labels), abs=1e-6
    )
    one = torch.ones(4, 1)  # one class: confidence 1 and always right
    assert expected_calibration_error(one, torch.zeros(4, dtype=torch.long)) == 0.0


def test_adaptive_ece_uses_equal_mass_bins():
    conf = torch.tensor([0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    probs = torch.stack([conf, 1 - conf], 1)
    labels = torch.tensor([0, 1, 0, 0, 1, 0])
    # 3 bins of two samples each: |1.1 - 1|, |1.5 - 1|, |1.85 - 1|, over 6 samples
    assert adaptive_calibration_error(probs, labels, 3) == pytest.approx(
        (0.1 + 0.5 + 0.85) / 6, abs=1e-6
    )


def test_nan_probabilities_give_nan_calibration_not_an_error():
    # a diverged model's softmax: the run must end as diverged, not fail inside a metric
    probs, labels = random_case(n=40)
    probs[3] = float("nan")
    for metric in (adaptive_calibration_error, expected_calibration_error):
        assert math.isnan(metric(probs, labels))


def test_brier_score_closed_form():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    labels = torch.tensor([0, 1])
    expected = ((0.3**2 + 0.2**2 + 0.1**2) + (0.1**2 + 0.9**2 + 0.8**2)) / 2
    assert brier_score(probs, labels) == pytest.approx(expected, abs=1e-6)


def test_adaptive_ece_does_not_depend_on_the_order_of_tied_samples():
    # confidences in ties of 3 (0.55, 0.7, 0.85, 0.95) cut into 5 bins of 12 samples: ties straddle
    # cuts
    conf = torch.tensor([0.55, 0.7, 0.85, 0.95]).repeat_interleave(3)
    probs = torch.stack([conf, 1 - conf], 1)
    labels = torch.tensor([0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 0])
    values = {
        adaptive_calibration_error(probs[p], labels[p], 5)
        for p in [torch.arange(12)]
        + [torch.randperm(12, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    }
    assert max(values) - min(values) <= 1e-7
    # ties kept whole: ranks 0, 3, 6, 9 open bins floor(5r/12) = 0, 1, 2, 3
    # class 0 is right
    per_tie = [
        abs(0.55 * 3 - 1),
        abs(0.7 * 3 - 2),
        abs(0.85 * 3 - 1),
        abs(0.95 * 3 - 3),
    ]
    assert adaptive_calibration_error(probs, labels, 5) == pytest.approx(
        sum(per_tie) / 12, abs=1e-6
    )


def test_reliability_bins_per_bin_against_a_direct_count():
    probs, labels = random_case(n=300)
    # confidence exactly 1: the last bin
    probs[0] = torch.nn.functional.one_hot(torch.tensor(3), 10).float()
    bins = reliability_bins(probs, labels, 15)
    assert bins["edges"] == [i / 15 for i in range(16)]
    conf, pred = probs.max(1)
    members = [[] for _ in range(15)]
    for c, right in zip(conf.tolist(), pred.eq(labels).tolist()):
        members[min(int(c * 15), 14)].append((c, right))
    assert bins["count"] == [len(m) for m in members]
    for b, m in enumerate(members):
        assert bins["confidence"][b] == pytest.approx(
            sum(c for c, _ in m) / len(m) if m else 0.0, abs=1e-6
        )
        assert bins["accuracy"][b] == pytest.approx(
            sum(r for _, r in m) / len(m) if m else 0.0, abs=1e-6
        )


def test_bad_input_is_one_clear_error():
    probs, labels = random_case(n=10)
    with pytest.raises(UserError, match="n_bins=0"):
        expected_calibration_error(probs, labels, 0)
    with pytest.raises(UserError, match=r"probs \[N, C\]"):
        expected_calibration_error(probs[0], labels)
