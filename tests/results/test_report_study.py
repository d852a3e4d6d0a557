"""A study preset's reference heads the report; long-tail split accuracies are reported unasked."""

from __future__ import annotations

import csv
import json

import yaml

from sam_runner.results.report import build_report, write_report


def _job(folder, n, optimizer, seed, acc, few, extra=(), done=True):
    d = folder / str(n)
    (d / ".hydra").mkdir(parents=True)
    overrides = [f"optimizer={optimizer}", f"seed={seed}", *extra]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    cfg = {
        "optimizer": {"name": optimizer, "rho": 0.1},
        "dataset": {"batch_size": 128},
        "base_optimizer": {"lr": 0.1},
        "study": {"name": "long_tail", "reference": "SGS-SAM: +10.85 tail"},
    }
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = {
        "status": "completed",
        "test_acc": acc,
        "test_ece": 0.1,
        "test_nll": 1.0,
        "lambda_max": 5.0,
        "test_acc_many": acc + 0.1,
        "test_acc_medium": acc,
        "test_acc_few": few,
        "overrides": overrides,
    }
    if done:  # else still running: no summary yet
        (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 10, "test_acc": acc}) + "\n")


def test_study_reference_and_split_metrics(tmp_path):
    _job(tmp_path, 0, "base", 0, 0.40, 0.10)
    _job(tmp_path, 1, "base", 1, 0.42, 0.14)
    _job(tmp_path, 2, "sam", 0, 0.45, 0.20)
    report = build_report(tmp_path)
    assert report.study["name"] == "long_tail"
    assert "test_acc_few" in report.metrics
    write_report(report)
    md = (tmp_path / "report.md").read_text()
    assert "Published reference: SGS-SAM: +10.85 tail" in md
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    few = [c for c in rows[0] if c.startswith("test_acc_few") and "mean" in c]
    assert few, rows[0].keys()
    base = next(r for r in rows if r["variant"] == "base")
    assert abs(float(base[few[0]]) - 0.12) < 1e-12


def test_split_metrics_are_found_when_only_a_late_job_has_finished(tmp_path):
    for n in range(6):
        _job(tmp_path, n, "sam", n, 0.45, 0.20, done=n == 5)
    assert "test_acc_few" in build_report(tmp_path).metrics


def test_groups_are_ordered_by_the_value_of_their_numbers(tmp_path):
    for n, b in enumerate((128, 32, 64)):
        _job(tmp_path, n, "sam", 0, 0.45, 0.20, extra=[f"dataset.batch_size={b}"])
    assert [g["label"] for g in build_report(tmp_path).groups] == [
        f"dataset.batch_size={b}" for b in (32, 64, 128)
    ]
