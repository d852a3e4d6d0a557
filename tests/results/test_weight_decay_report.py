"""sam-report's weight-decay section (the ouidecay presets): each layer's final coefficient over
the base λ and the OUI by epoch, per group, from real tiny runs (constant and OUIDecay)."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, compose
from results_helpers import train_sweep_job

from sam_runner.results.report import build_report
from sam_runner.results.report import main as report_main
from sam_runner.results.weight_decay import weight_decay_groups

RUN = [*TINY, "metrics=off", "metrics.oui=true"]
OUIDECAY = ["weight_decay=ouidecay", "weight_decay.every_n_steps=4"]
LABEL = " ".join(OUIDECAY)


def _job(root, num: int, overrides: list[str]):
    train_sweep_job(root / str(num), overrides, RUN)


def _oui_by_epoch(run_dir) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["epoch"]: r["oui"] for r in rows if "oui" in r}


def test_the_section_gives_each_layers_multiple_and_the_oui_by_group(tmp_path):
    root = tmp_path / "sweep"
    _job(root, 0, ["weight_decay=constant"])
    _job(root, 1, OUIDECAY)
    groups = {g["label"]: g for g in weight_decay_groups(build_report(root))}
    assert set(groups) == {"weight_decay=constant", LABEL}

    summary = json.loads((root / "1" / "summary.json").read_text())
    base = compose(*RUN).base_optimizer.weight_decay
    layers = groups[LABEL]["layers"]
    assert list(layers) == list(summary["weight_decay_layers"])
    for name, value in summary["weight_decay_layers"].items():
        assert layers[name]["mean"] == pytest.approx(value / base, rel=1e-5)
    assert len({round(s["mean"], 4) for s in layers.values()}) > 1  # the layers were rescaled
    assert groups["weight_decay=constant"]["layers"] == {}  # constant: no coefficients of its own

    for num, label in ((0, "weight_decay=constant"), (1, LABEL)):
        logged = _oui_by_epoch(root / str(num))
        assert groups[label]["oui"] == {e: [v] for e, v in logged.items()} and len(logged) == 2
        assert groups[label]["last_oui"]["mean"] == logged[max(logged)]

    assert report_main([str(root), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Weight decay by layer" in md and "![weight_decay](weight_decay.png)" in md
    assert "| weight_decay=constant | ×1 (constant) |" in md
    figure = tmp_path / "report" / "weight_decay.png"
    assert figure.stat().st_size > 0
    drawn = figure.stat().st_ino  # a figure written again (atomically) is a new file
    assert report_main([str(root), "--out", str(tmp_path / "report")]) == 0
    assert figure.stat().st_ino == drawn  # kept by the report again: its data is unchanged


def test_a_sweep_without_ouidecay_has_no_weight_decay_section(tmp_path):
    root = tmp_path / "plain"
    _job(root, 0, ["weight_decay=constant"])
    assert weight_decay_groups(build_report(root)) is None
    assert report_main([str(root), "--out", str(tmp_path / "report")]) == 0
    assert "## Weight decay by layer" not in (tmp_path / "report" / "report.md").read_text()
