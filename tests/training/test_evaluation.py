"""The training pass's epoch statistics: the accuracy counted from predictions kept for many
steps at once is the per-step count, through a checkpoint within the epoch and a log line."""

from __future__ import annotations

import pytest
import torch

from sam_runner.distributed import Topology
from sam_runner.training.evaluation import FOLD_COUNTS, EpochStats, count_correct


def test_predictions_counted_in_one_go_give_each_step_s_count_through_a_checkpoint():
    g = torch.Generator().manual_seed(0)
    stats, right, seen = EpochStats(torch.device("cpu"), Topology()), 0, 0
    for step in range(1, 2 * FOLD_COUNTS + 7):  # folded on the way, and with steps waiting
        counts = {"predicted": [], "targets": 0}
        for _ in range(2):  # two micro-batches
            logits, labels = torch.randn(8, 5, generator=g), torch.randint(0, 5, (8,), generator=g)
            count_correct(logits, labels, counts)
            right += int((logits.argmax(1) == labels).sum())
        stats.add(torch.tensor(0.5), counts["predicted"], counts["targets"], step)
        seen += counts["targets"]
        if step == FOLD_COUNTS + 3:  # a checkpoint within the epoch holds the count so far
            saved = {k: v.clone() if torch.is_tensor(v) else v  # as written to the file
                     for k, v in stats.state_dict().items()}  # fmt: skip
            right_then = right
    assert float(saved["correct"]) == right_then
    assert stats.log_values()["train_acc"] == pytest.approx(right / seen, rel=1e-6)
    assert float(stats.count_predicted()) == right  # every prediction counted, once
    resumed = EpochStats(torch.device("cpu"), Topology())
    resumed.load_state_dict(saved)
    assert float(resumed.count_predicted()) == right_then and resumed.seen == saved["seen"]


def test_the_first_non_finite_step_is_found_among_steps_checked_in_one_go():
    stats = EpochStats(torch.device("cpu"), Topology())
    losses = {step: torch.tensor(1.0) for step in range(1, 3 * FOLD_COUNTS)}
    losses[FOLD_COUNTS + 5], losses[FOLD_COUNTS + 9] = (
        torch.tensor(float("nan")),
        torch.tensor(float("inf")),
    )
    for step in range(1, FOLD_COUNTS + 5):
        stats.add(losses[step], [], 1, step)
    assert stats.diverged_at() is None
    for step in range(FOLD_COUNTS + 5, 3 * FOLD_COUNTS):  # the first bad one stays the first
        stats.add(losses[step], [], 1, step)
    assert stats.diverged_at() == FOLD_COUNTS + 5
    resumed = EpochStats(torch.device("cpu"), Topology())  # a resumed epoch: steps jump
    resumed.add(torch.tensor(1.0), [], 1, 3)
    resumed.add(torch.tensor(float("inf")), [], 1, 10)
    assert resumed.state_dict()["first_bad"] == 10
    waiting = EpochStats(torch.device("cpu"), Topology())  # fewer steps than a fold: read now
    waiting.add(torch.tensor(1.0), [], 1, 1)
    waiting.add(torch.tensor(float("nan")), [], 1, 2)
    assert waiting.diverged_at() == 2
