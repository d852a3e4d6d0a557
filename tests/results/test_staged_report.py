"""sam-report on a preset in stages (pretrain -> midtrain -> posttrain, folders written here as
the stages write them): groups labelled by their stage and what varies in it, in the preset's
stage order; the compute front and the ρ figures within a stage; the forgetting table's means,
stds and reductions recomputed here."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
import yaml

from sam_runner.plots.sweep import _panels
from sam_runner.results.compute import compute_points, pareto_front
from sam_runner.results.forgetting import rows
from sam_runner.results.report import build_report, write_report

STAGES = {"pretrain": {"seed": "0,1"}, "midtrain": {}, "posttrain": {}}
MID = {"base": ["optimizer=base"], "sam": ["optimizer=sam", "optimizer.rho=0.05"]}
# (mid-training, seed) -> (mid test acc, post test acc, mid 4-bit drop)
ACC = {
    ("base", 0): (0.60, 0.50, 0.030),
    ("base", 1): (0.62, 0.48, 0.050),
    ("sam", 0): (0.61, 0.57, 0.010),
    ("sam", 1): (0.63, 0.55, 0.020),
}


def _job(folder, overrides, variant, summary, init_from=None):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"optimizer": {"name": variant, "rho": 0.05}, "stages": STAGES}
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if init_from is not None:
        summary["init_from"] = {"path": str(init_from / "checkpoints" / "last.pt")}
    summary = dict(status="completed", lambda_max=5.0, step=10, overrides=overrides, **summary)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 10}) + "\n")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("staged")
    for stage in STAGES:  # each stage is a sweep folder of its own
        (root / stage).mkdir()
        (root / stage / "multirun.yaml").write_text("{}\n")
    for seed in (0, 1):
        _job(root / "pretrain" / str(seed), [f"seed={seed}"], "base",
             dict(test_acc=0.9, test_loss=0.3, grad_evals_per_step=1))  # fmt: skip
    for n, ((mid, seed), (acc_mid, acc_post, drop)) in enumerate(ACC.items()):
        ref = "model.init_from=stage\\:pretrain"
        mid_dir, post_dir = root / "midtrain" / str(n), root / "posttrain" / str(n)
        _job(mid_dir, [ref, "trainer.epochs=2", *MID[mid], f"seed={seed}"], mid,
             dict(test_acc=acc_mid, test_loss=1.0, quant_drop_4bit=drop,
                  grad_evals_per_step=2 if mid == "sam" else 1),
             init_from=root / "pretrain" / str(seed))  # fmt: skip
        selector = "/".join(o.replace("=", "\\:") for o in MID[mid])
        post = dict(test_acc=acc_post, test_loss=1.5, grad_evals_per_step=1)
        ref = f"model.init_from=stage\\:midtrain/{selector}"
        _job(post_dir, [ref, f"seed={seed}"], "base", post, init_from=mid_dir)
    return root


@pytest.fixture(scope="module")
def report(sweep):
    return build_report(sweep)


def test_groups_are_labelled_by_stage_in_the_presets_order(report):
    assert [g["label"] for g in report.groups] == [
        "pretrain",
        "midtrain: optimizer=base",
        "midtrain: optimizer=sam optimizer.rho=0.05",
        "posttrain: from midtrain optimizer=base",
        "posttrain: from midtrain optimizer=sam optimizer.rho=0.05",
    ]
    # the ρ figures: only the stage where a variant has ρ gets a panel
    assert list(_panels(report.groups)) == ["midtrain"]


def test_the_compute_front_is_drawn_within_each_stage(report):
    points = compute_points(report)
    front = pareto_front(points, "test_acc", maximize=True)
    on = {p["stage"] for p, f in zip(points, front) if f}
    # pretraining is cheapest and most accurate of all; it still dominates no later stage
    assert on == {"pretrain", "midtrain", "posttrain"}


def test_the_forgetting_table_has_means_stds_and_reductions(report, tmp_path):
    table = {r["midtraining"]: r for r in rows(report)}
    assert list(table) == ["base", "sam ρ=0.05"]
    for mid, label in (("base", "base"), ("sam", "sam ρ=0.05")):
        forgetting = [ACC[mid, s][0] - ACC[mid, s][1] for s in (0, 1)]
        got = table[label]["stats"]["forgetting_acc"]
        assert got["mean"] == pytest.approx(statistics.fmean(forgetting))
        assert got["std"] == pytest.approx(statistics.stdev(forgetting))
    base, sam = (table[k]["stats"] for k in ("base", "sam ρ=0.05"))
    assert table["sam ρ=0.05"]["reductions"]["reduction_4bit_pct"] == pytest.approx(
        100
        * (base["quant_drop_4bit"]["mean"] - sam["quant_drop_4bit"]["mean"])
        / base["quant_drop_4bit"]["mean"]
    )
    write_report(report, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| base | 0.61 ± 0.014 | 0.49 ± 0.014 | 0.12 ± 0.028 |" in md
    assert "| reference | reference | 2 |" in md and "![forgetting](forgetting.png)" in md
    assert (tmp_path / "forgetting.png").stat().st_size > 0
    with open(tmp_path / "forgetting.csv") as f:
        saved = {r["midtraining"]: r for r in csv.DictReader(f)}
    assert float(saved["sam ρ=0.05"]["forgetting_acc_std"]) == pytest.approx(
        statistics.stdev([0.61 - 0.57, 0.63 - 0.55])
    )
