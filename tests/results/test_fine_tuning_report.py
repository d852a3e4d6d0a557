"""sam-report's fine-tuning section on handmade folders: one row per (model, pretraining,
fine-tuning, lr) with the second task's loss and the first task's rise recomputed here, the
pretrained checkpoints' λ_max, fine_tuning.csv and the figure; no section without a chain."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from sam_runner.results.fine_tuning import rows
from sam_runner.results.report import build_report, write_report

PRETRAINED = {"adamw": (0.50, 0.80, 20.0), "muon": (0.60, 0.78, 9.0)}  # test loss, acc, λ_max
# (pretrained by, fine-tuned by, peft, lr, seed, train loss, test loss, test acc, λ_max)
TUNED = [
    ("adamw", "adamw", "none", 0.01, 0, 1.2, 0.9, 0.60, 4.0),
    ("adamw", "adamw", "none", 0.01, 1, 1.4, 1.1, 0.56, 6.0),
    ("adamw", "muon", "none", 0.01, 0, 1.3, 1.5, 0.40, 3.0),
    ("muon", "adamw", "lora", 0.001, 0, 2.0, 0.7, 0.75, 0.5),
]


def _job(folder, config, summary, train_loss=None):
    (folder / ".hydra").mkdir(parents=True)
    overrides = [f"{k}={v}" for k, v in config.items() if k != "model"]
    tree = {"optimizer": {"name": "base"}, "model": config["model"]}
    tree["base_optimizer"] = {"name": config["base_optimizer"], "lr": config["lr"]}
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(tree))
    summary = dict(status="completed", test_ece=0.1, step=10, overrides=overrides, **summary)
    (folder / "summary.json").write_text(json.dumps(summary))
    line = {"epoch": 1, "step": 10, "train_loss": train_loss, "train_acc": 0.5}
    (folder / "metrics.jsonl").write_text(json.dumps(line) + "\n")


def _sweep(root, tuned=TUNED):
    for opt, (loss, acc, lam) in PRETRAINED.items():
        model = {"arch": "mlp", "peft": "none", "init_from": None}
        summary = dict(test_loss=loss, test_acc=acc, lambda_max=lam)
        _job(root / "pretrain" / opt, dict(base_optimizer=opt, lr=0.003, model=model), summary)
    for n, (pre, opt, peft, lr, seed, train_loss, loss, acc, lam) in enumerate(tuned):
        source = root / "pretrain" / pre
        model = {"arch": "mlp", "peft": peft, "init_from": str(source)}
        summary = dict(test_loss=loss, test_acc=acc, lambda_max=lam, trainable_parameters=7)
        summary["init_from"] = {"path": str(source / "checkpoints" / "last.pt")}
        config = dict(base_optimizer=opt, lr=lr, seed=seed, peft=peft, pre=pre, model=model)
        _job(root / "finetune" / str(n), config, summary, train_loss)


def test_one_row_per_pair_and_lr_with_learning_and_forgetting(tmp_path):
    _sweep(tmp_path)
    report = build_report(tmp_path)
    table = rows(report)
    got = {(r["pretraining"], r["fine_tuning"], r["lr"]): r for r in table}
    assert sorted(got) == [
        ("adamw", "full adamw", 0.01), ("adamw", "full muon", 0.01), ("muon", "lora adamw", 0.001)
    ]  # fmt: skip
    same = got[("adamw", "full adamw", 0.01)]
    assert same["n"] == 2 and same["same_optimizer"] is True
    assert same["new_loss"]["mean"] == pytest.approx(1.3)  # the mean of the two seeds
    assert same["loss_rise"]["mean"] == pytest.approx((0.9 + 1.1) / 2 - 0.50)
    assert same["acc_drop"]["mean"] == pytest.approx(0.80 - (0.60 + 0.56) / 2)
    assert same["lambda_max_pretrained"]["mean"] == 20.0 and same["lambda_max"]["mean"] == 5.0
    lora = got[("muon", "lora adamw", 0.001)]
    assert lora["same_optimizer"] is False and lora["loss_rise"]["mean"] == pytest.approx(0.1)
    assert got[("adamw", "full muon", 0.01)]["same_optimizer"] is False
    write_report(report, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Fine-tuning: learning and forgetting" in md and "### Pretrained checkpoints" in md
    assert "| mlp | muon | 0.6 | 0.78 | 9 |" in md  # the pretrained checkpoint's own row
    assert (tmp_path / "out" / "fine_tuning.png").stat().st_size > 0
    with open(tmp_path / "out" / "fine_tuning.csv") as f:
        written = list(csv.DictReader(f))
    assert len(written) == 3 and float(written[0]["loss_rise"]) == pytest.approx(0.5)


def test_no_section_without_a_fine_tuned_job(tmp_path):
    _sweep(tmp_path, tuned=[])
    report = build_report(tmp_path)
    assert rows(report) == []
    write_report(report, tmp_path / "out")
    assert "## Fine-tuning" not in (tmp_path / "out" / "report.md").read_text()
    assert not (tmp_path / "out" / "fine_tuning.csv").exists()
