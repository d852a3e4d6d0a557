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
