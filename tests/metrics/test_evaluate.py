"""Per-split (many/medium/few-shot) accuracy for long-tailed studies."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, compose

from sam_runner.metrics.evaluate import split_accuracy
from sam_runner.train import train


def test_split_accuracy_by_training_class_size():
    counts = [500, 150, 50, 30, 10, 5]  # many: 0,1  medium: 2,3  few: 4,5
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 0, 4])
    pred = torch.tensor([0, 0, 2, 2, 4, 4, 0, 0])
    out = split_accuracy(pred, labels, counts, many=100, few=20)
    assert out == {
        "test_acc_many": pytest.approx(2 / 3),
        "test_acc_medium": 0.5,
        "test_acc_few": pytest.approx(1 / 3),
    }


def test_empty_split_is_none():
    out = split_accuracy(torch.tensor([0]), torch.tensor([0]), [500, 5], many=100, few=20)
    assert out["test_acc_many"] == 1.0 and out["test_acc_medium"] is None


def test_long_tailed_run_reports_splits(tmp_path):
    summary = train(
        compose(
            *TINY,
            "dataset.imbalance_ratio=10",
            "metrics.class_splits={many:40,few:15}",
            "metrics.hessian.enabled=false",
        ),
        tmp_path,
        [],
    )
    for key in ("test_acc_many", "test_acc_medium", "test_acc_few"):
        assert key in summary
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["test_acc_many"] == summary["test_acc_many"]
