"""sam-report's accuracy per compute: the cost column, compute.png written, the Pareto fronts
the non-dominated groups (computed here), and the cheapest group that matches SAM."""

from __future__ import annotations

import csv
import json

import yaml

from sam_runner.results.compute import compute_points, pareto_front
from sam_runner.results.report import build_report, write_report

# label: (optimizer, extra overrides, passes per step, test accuracy, λ_max)
GROUPS = {
    "sgd": ("base", [], 1.0, 0.800, 30.0),
    "sam": ("sam", [], 2.0, 0.850, 10.0),
    "every2": ("sam", ["optimizer.interval=2"], 1.5, 0.848, 10.5),
    "every5": ("sam", ["optimizer.interval=5"], 1.2, 0.830, 14.0),
    "worse": ("sam", ["optimizer.perturb_schedule=random"], 1.6, 0.820, 20.0),  # dominated
    "look": ("look_sam", ["optimizer.k=5"], 1.2, 0.835, 12.0),
}
STEPS = 500


def _job(folder, n, optimizer, extra, seed, passes, acc, lam):
    d = folder / str(n)
    (d / ".hydra").mkdir(parents=True)
    overrides = [f"optimizer={optimizer}", *extra, f"seed={seed}"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    cfg = {"optimizer": {"name": optimizer, "rho": 0.05}, "dataset": {"batch_size": 128}}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = dict(status="completed", test_acc=acc + 0.001 * seed, test_ece=0.1, test_nll=1.0)
    summary.update(lambda_max=lam, grad_evals_per_step=passes, step=STEPS, overrides=overrides)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": STEPS}) + "\n")


def _sweep(tmp_path):
    n = 0
    for optimizer, extra, passes, acc, lam in GROUPS.values():
        for seed in (0, 1):
            _job(tmp_path, n, optimizer, extra, seed, passes, acc, lam)
            n += 1
    return build_report(tmp_path)


def _front_by_hand(points, key, up):
    """The non-dominated points, by brute force over every pair."""
    sign = 1 if up else -1
    out = set()
    for p in points:
        if not any(
            q["evals"] <= p["evals"]
            and sign * q[key] >= sign * p[key]
            and (q["evals"], q[key]) != (p["evals"], p[key])
            for q in points
        ):
            out.add(p["label"])
    return out


def test_the_figure_and_the_fronts(tmp_path):
    report = _sweep(tmp_path)
    written = write_report(report)
    assert tmp_path / "compute.png" in written and (tmp_path / "compute.png").stat().st_size > 0
    points = compute_points(report)
    assert len(points) == len(GROUPS)
    by_passes = {p["passes"]: p for p in points}
    assert by_passes[2.0]["evals"] == 2.0 * STEPS and by_passes[1.0]["evals"] == STEPS
    for key, up in (("test_acc", True), ("lambda_max", False)):
        flags = pareto_front(points, key, up)
        got = {p["label"] for p, on in zip(points, flags) if on}
        assert got == _front_by_hand(points, key, up)
    on_acc = {p["label"] for p, on in zip(points, pareto_front(points, "test_acc", True)) if on}
    assert "optimizer=sam optimizer.perturb_schedule=random" not in on_acc  # dominated by every2
    assert "optimizer=sam" in on_acc and "optimizer=base" in on_acc


def test_the_cost_column_and_the_cheapest_match(tmp_path):
    report = _sweep(tmp_path)
    write_report(report)
    rows = {r["group"]: r for r in csv.DictReader((tmp_path / "report.csv").open())}
    assert float(rows["optimizer=sam optimizer.interval=2"]["grad_evals_per_step_mean"]) == 1.5
    md = (tmp_path / "report.md").read_text()
    assert "passes/step" in md and "## Accuracy per compute" in md
    assert "![compute](compute.png)" in md
    # every2 is within 0.3 points (0.848 vs 0.850) and 10% of λ_max (10.5 vs 10): the cheapest
    assert "`optimizer=sam optimizer.interval=2`, 1.5 passes/step" in md


def test_a_sweep_whose_groups_cost_the_same_has_no_compute_figure_or_section(tmp_path):
    """#58 item 9: a ρ sweep of one variant drew compute.png over one x value."""
    for n, rho_acc in enumerate((0.80, 0.82, 0.81)):
        _job(tmp_path, n, "sam", [f"optimizer.rho=0.0{n + 1}"], 0, 2.0, rho_acc, 10.0 + n)
    written = write_report(build_report(tmp_path))
    assert not (tmp_path / "compute.png").exists() and tmp_path / "compute.png" not in written
    assert "## Accuracy per compute" not in (tmp_path / "report.md").read_text()
