"""sam-report's quantization section: per-variant means of the measured drops and loss rises
beside the predicted rise, Kendall's τ of predicted against measured recomputed here, and no
section when no job was quantized."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml
from scipy.stats import kendalltau

from sam_runner.results.quantization import quantization_rows
from sam_runner.results.report import build_report, write_report

# (optimizer, seed, 4-bit drop, 4-bit measured rise, 4-bit predicted rise)
JOBS = [
    ("base", 0, 0.010, 0.030, 0.020),
    ("base", 1, 0.014, 0.050, 0.045),
    ("sam", 0, 0.002, 0.010, 0.012),
    ("sam", 1, 0.004, 0.020, 0.008),
]


def _job(folder, n, optimizer, seed, drop, rise, pred, measured=True):
    d = folder / str(n)
    (d / ".hydra").mkdir(parents=True)
    overrides = [f"optimizer={optimizer}", f"seed={seed}"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"optimizer": {"name": optimizer}}))
    summary = dict(status="completed", test_acc=0.8, test_ece=0.1, lambda_max=5.0, step=10)
    (d / "summary.json").write_text(json.dumps({**summary, "overrides": overrides}))
    (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 10}) + "\n")
    if measured:
        values = {"quant_drop_4bit": drop, "quant_loss_rise_4bit": rise}
        values.update(quant_loss_rise_pred_4bit=pred, quant_drop_8bit=drop / 10)
        (d / "eval.json").write_text(json.dumps({**summary, **values}))


def test_the_section_gives_each_variants_drops_and_tau(tmp_path):
    for n, job in enumerate(JOBS):
        _job(tmp_path, n, *job)
    _job(tmp_path, len(JOBS), "base", 2, None, None, None, measured=False)  # not quantized
    found = quantization_rows(build_report(tmp_path))
    assert found["bits"] == [8, 4]
    for variant in ("base", "sam"):
        mine = [j for j in JOBS if j[0] == variant]
        row = found["rows"][variant]
        assert row["quant_drop_4bit"]["mean"] == pytest.approx(statistics.fmean(j[2] for j in mine))
        assert row["quant_loss_rise_pred_4bit"]["mean"] == pytest.approx(
            statistics.fmean(j[4] for j in mine)
        )
        assert row["quant_loss_rise_8bit"]["n"] == 0  # the 8-bit rise was not measured
        assert row["test_acc"]["n"] == len(mine)  # the job that was not quantized is left out
    tau, n = found["tau"][4]
    assert n == 4 and tau == pytest.approx(
        kendalltau([j[4] for j in JOBS], [j[3] for j in JOBS])[0]
    )
    assert 8 not in found["tau"]  # no 8-bit rise: nothing to correlate
    write_report(build_report(tmp_path), tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Quantization" in md and "| sam | 0.8 ± 0 |" in md
    assert f"Kendall's τ between predicted and measured loss rise {tau:+.3f} over 4 jobs" in md


def test_no_section_without_quantized_jobs(tmp_path):
    for n, job in enumerate(JOBS):
        _job(tmp_path, n, *job, measured=False)
    assert quantization_rows(build_report(tmp_path)) is None
    write_report(build_report(tmp_path), tmp_path / "out")
    assert "## Quantization" not in (tmp_path / "out" / "report.md").read_text()
