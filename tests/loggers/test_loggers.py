"""logger=tensorboard and logger=csv, alone and with W&B (logger=[wandb,tensorboard,csv]): what
they wrote, read back with TensorBoard's own EventAccumulator and the csv module."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest
from omegaconf import OmegaConf

from sam_runner.loggers import Loggers, build_logger, chosen
from sam_runner.loggers.csv_file import CSVLogger


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("loggers") / "run"
    proc = subprocess.run(
        [
            "sam-run",
            "logger=[wandb,tensorboard,csv]",
            "logger.mode=offline",
            "trainer.epochs=2",
            "dataset.num_samples=500",
            "metrics.hessian.num_samples=128",
            "metrics.hessian.max_iter=10",
            "trainer.progress=none",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def logged(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_events_hold_the_logged_scalars_and_the_reliability_figure(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    lines = logged(run)
    for key in ("test_acc", "train_loss", "lambda_max"):
        events = acc.Scalars(key)
        want = [(r["step"], r[key]) for r in lines if key in r]
        assert [e.step for e in events] == [s for s, _ in want], key
        assert [e.value for e in events] == pytest.approx([v for _, v in want], rel=1e-6), key
    summary = json.loads((run / "summary.json").read_text())
    assert acc.Scalars("final/test_acc")[-1].value == pytest.approx(summary["test_acc"], rel=1e-6)
    assert "reliability" in acc.Tags()["images"]


def test_csv_rows_are_the_metrics_lines_and_wandb_logged_too(run):
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    lines = logged(run)
    assert len(rows) == len(lines)
    assert [float(r["test_acc"]) for r in rows] == [x["test_acc"] for x in lines]
    with open(run / "summary.csv", newline="") as f:
        summary = dict(csv.reader(f))
    assert float(summary["test_acc"]) == json.loads((run / "summary.json").read_text())["test_acc"]
    assert any((run / "wandb").glob("offline-run-*"))


def test_one_logger_alone_and_several_together():
    one = OmegaConf.create({"name": "csv", "loggers": {"csv": True}})
    assert chosen(one) == ["csv"] and isinstance(build_logger(one, ".", None), CSVLogger)
    two = OmegaConf.create({"name": "csv", "loggers": {"tensorboard": True, "csv": True}})
    both = build_logger(two, ".", None)
    assert isinstance(both, Loggers) and list(both.parts) == ["tensorboard", "csv"]
    assert chosen(OmegaConf.create({"name": "none"})) == ["none"]


def test_a_resumed_csv_log_drops_the_rows_after_its_checkpoint(tmp_path):
    first = CSVLogger(tmp_path)
    first.start()
    first.log({"epoch": 1, "step": 3, "test_acc": 0.5})
    state = first.state_dict()  # the checkpoint, after row 1
    first.log({"epoch": 2, "step": 6, "test_acc": 0.6, "lambda_max": 2.0})
    again = CSVLogger(tmp_path)
    again.load_state_dict(state)
    again.start()
    again.log({"epoch": 2, "step": 6, "test_acc": 0.7})
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["test_acc"] for r in rows] == ["0.5", "0.7"]
