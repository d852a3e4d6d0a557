"""sam-report's α-skew JSD section: λ_max against α(1−α) per variant, from real tiny runs."""

from __future__ import annotations

import json

import pytest
from conftest import compose
from results_helpers import train_sweep_job

from sam_runner.results.jsd import jsd_points
from sam_runner.results.report import build_report
from sam_runner.results.report import main as report_main
from sam_runner.train import train

TINY = [
    "trainer.epochs=1",
    "dataset.num_samples=600",
    "model=mlp",
    "model.hidden=[32]",
    "metrics.hessian.num_samples=128",
    "metrics.hessian.max_iter=10",
    "trainer.progress=none",
    "regularizer=jsd",
    "regularizer.space=input",
]
# (variant, weight, alpha): the sweep of jsd_vs_sam in miniature, one seed
JOBS = [
    ("base", 0, 0.5),
    ("base", 1, 0.25),
    ("base", 1, 0.75),
    ("base", 1, 0.5),
    ("sam", 1, 0.25),
    ("sam", 1, 0.5),
]


def sweep(root):
    for num, (variant, weight, alpha) in enumerate(JOBS):
        overrides = [
            f"optimizer={variant}",
            f"regularizer.weight={weight}",
            f"regularizer.alpha={alpha}",
        ]
        train_sweep_job(root / str(num), overrides, TINY)
    return root


@pytest.mark.slow  # six tiny runs: about 25 s on two loaded cores
def test_the_jsd_section_gives_lambda_max_per_variant_and_alpha(tmp_path):
    root = sweep(tmp_path / "sweep")
    lam = [json.loads((root / str(n) / "summary.json").read_text())["lambda_max"] for n in range(6)]
    points = jsd_points(build_report(root))
    rows = points["rows"]
    assert set(rows) == {("base", 0.25), ("base", 0.5), ("base", 0.75), ("sam", 0.25), ("sam", 0.5)}
    for n, (variant, weight, alpha) in enumerate(JOBS):
        if weight:
            s = rows[(variant, alpha)]["lambda_max"]
            assert s["mean"] == pytest.approx(lam[n], rel=1e-12) and s["n"] == 1
    assert points["reference"]["base"]["lambda_max"]["mean"] == pytest.approx(lam[0], rel=1e-12)
    assert "sam" not in points["reference"]  # no weight-0 SAM job
    assert points["keys"] == ["lambda_max"]  # the Fisher trace ratio was not measured
    assert report_main([str(root), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## α-skew JSD" in md and "![jsd](jsd.png)" in md
    assert f"| base | 0.25 | 0.1875 | {lam[1]:.4g} |" in md
    assert (tmp_path / "report" / "jsd.png").stat().st_size > 0


def test_a_sweep_of_one_alpha_has_no_jsd_section(tmp_path):
    assert jsd_points(build_report(sweep_one(tmp_path))) is None


def sweep_one(tmp_path):
    root = tmp_path / "one"
    cfg = compose(*TINY, "metrics=off", "optimizer=base")
    train(cfg, root / "0", ["optimizer=base"])
    return root
