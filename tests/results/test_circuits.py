"""The circuits section of sam-report: one row per training setting over seeds, the weight-0
jobs of both regularizers one plain row, each seed once."""

from __future__ import annotations

import json

import pytest
from results_helpers import train_sweep_job

from sam_runner.results.circuits import circuit_rows, circuits_section, write_circuits
from sam_runner.results.report import build_report

BASE = [
    "model=pc", "model.depth=2", "model.sum_units=2", "model.repetitions=1", "dataset=digits",
    "dataset.binarize=true", "dataset.train_subset=60", "dataset.batch_size=30",
    "trainer.loss=nll", "trainer.epochs=1", "trainer.progress=none", "base_optimizer=em",
    "optimizer=base", "base_optimizer.lr=0.5", "metrics.hessian.max_iter=10",
]  # fmt: skip
JOBS = [
    ("pc_trace", 0, 0),
    ("pc_adaptive", 0, 0),  # the same plain run as the one above
    ("pc_trace", 0, 1),
    ("pc_adaptive", 0.01, 0),
]


def test_the_section_has_a_row_per_setting_with_the_plain_run_once_a_seed(tmp_path):
    for n, (reg, weight, seed) in enumerate(JOBS):
        overrides = [f"regularizer={reg}", f"regularizer.weight={weight}", f"seed={seed}"]
        train_sweep_job(tmp_path / str(n), overrides, BASE)
    summaries = [json.loads((tmp_path / str(n) / "summary.json").read_text()) for n in range(4)]
    rows, depth = circuit_rows(build_report(tmp_path))
    assert depth == 2 and set(rows) == {("em", "none", 0.0), ("em", "pc_adaptive", 0.01)}
    plain = rows[("em", "none", 0.0)]
    assert plain["test_bpd"]["n"] == 2  # seeds 0 and 1; the second weight-0 job is the first
    mean = (summaries[0]["hessian_trace_exact"] + summaries[2]["hessian_trace_exact"]) / 2
    assert plain["hessian_trace_exact"]["mean"] == pytest.approx(mean, rel=1e-12)
    gap = summaries[3]["train_ll"] - summaries[3]["test_ll"]
    assert rows[("em", "pc_adaptive", 0.01)]["gap"]["mean"] == pytest.approx(gap, rel=1e-12)
    text = "\n".join(circuits_section(build_report(tmp_path)))
    assert "## Probabilistic circuits" in text and "| em | pc_adaptive | 0.01 | 1 |" in text
    assert "![circuits](circuits.png)" in text
    (path,) = write_circuits(build_report(tmp_path), tmp_path)
    assert path.name == "circuits.png" and path.stat().st_size > 1000
