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
    tree = {"optimizer": {"name": config.get("variant", "base")}, "model": config["model"]}
    if "rho" in config:
        tree["optimizer"]["rho"] = config["rho"]
    tree["base_optimizer"] = {"name": config["base_optimizer"], "lr": config["lr"]}
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(tree))
    summary = dict(status="completed", test_ece=0.1, step=10, overrides=overrides, **summary)
    (folder / "summary.json").write_text(json.dumps(summary))
    line = {"epoch": 1, "step": 10, "train_loss": train_loss, "train_acc": 0.5}
    (folder / "metrics.jsonl").write_text(json.dumps(line) + "\n")


def _tuned_job(folder, source, config, summary, train_loss=None):
    model = {"arch": "mlp", "peft": config["peft"], "init_from": str(source)}
    summary = dict(summary, trainable_parameters=7)
    summary["init_from"] = {"path": str(source / "checkpoints" / "last.pt")}
    _job(folder, dict(config, model=model), summary, train_loss)


def _sweep(root, tuned=TUNED):
    for opt, (loss, acc, lam) in PRETRAINED.items():
        model = {"arch": "mlp", "peft": "none", "init_from": None}
        summary = dict(test_loss=loss, test_acc=acc, lambda_max=lam)
        _job(root / "pretrain" / opt, dict(base_optimizer=opt, lr=0.003, model=model), summary)
    for n, (pre, opt, peft, lr, seed, train_loss, loss, acc, lam) in enumerate(tuned):
        summary = dict(test_loss=loss, test_acc=acc, lambda_max=lam)
        config = dict(base_optimizer=opt, lr=lr, seed=seed, peft=peft, pre=pre)
        _tuned_job(root / "finetune" / str(n), root / "pretrain" / pre, config, summary, train_loss)


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


def test_a_chain_of_three_stages_is_not_fine_tuning_and_two_rhos_are_two_rows(tmp_path):
    _sweep(tmp_path)
    # a third stage from finetune/0 (as sam_midtraining's post-training from its mid-training):
    # that chain is the forgetting section's, so neither of its links is a fine-tuning pair
    summary = dict(test_loss=1.0, test_acc=0.5, lambda_max=1.0)
    config = dict(base_optimizer="sgd", lr=0.05, seed=0, peft="none", pre="adamw")
    _tuned_job(tmp_path / "post" / "0", tmp_path / "finetune" / "0", config, summary, 1.0)
    # two SAM fine-tunings of one checkpoint that differ only in ρ
    for n, rho in enumerate((0.05, 0.2)):
        config = dict(base_optimizer="adamw", lr=0.01, seed=0, peft="none", variant="sam", rho=rho)
        summary = dict(test_loss=0.7 + rho, test_acc=0.7, lambda_max=2.0)
        _tuned_job(tmp_path / "sam" / str(n), tmp_path / "pretrain" / "muon", config, summary, 1.0)
    got = {(r["pretraining"], r["fine_tuning"]): r for r in rows(build_report(tmp_path))}
    assert got[("adamw", "full adamw")]["n"] == 1  # finetune/0 is a chain's middle, not a leaf
    assert ("adamw", "full sgd") not in got  # the post-training stage is no fine-tuning
    assert got[("muon", "full sam-adamw ρ=0.05")]["loss_rise"]["mean"] == pytest.approx(0.15)
    assert got[("muon", "full sam-adamw ρ=0.2")]["loss_rise"]["mean"] == pytest.approx(0.30)
    assert got[("muon", "full sam-adamw ρ=0.2")]["same_optimizer"] is False
