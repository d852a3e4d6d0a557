"""sam-report on a real sweep: the table's numbers, the CSV, the plots, unfinished and failed jobs."""
from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess

import pytest

from results_helpers import SWEEP_ARGS, copy_sweep, shared_sweep
from sam_runner.report import build_report, gamma_near_end, group_overrides, main, tlc_bound

METRICS = ("test_acc", "test_ece", "test_nll", "lambda_max")


def summaries(sweep):
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]


def csv_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert main([str(shared_sweep()), "--out", str(out), "--metric", "train_time_s", "--metric", "train_loss"]) == 0
    return out


def test_table_means_equal_the_means_of_the_job_summaries(reported):
    rows = {r["variant"]: r for r in csv_rows(reported / "report.csv")}
    assert set(rows) == {"base", "sam"}
    for variant, row in rows.items():
        jobs = [s for s in summaries(shared_sweep()) if f"optimizer={variant}" in s["overrides"]]
        assert len(jobs) == 2 and int(row["completed"]) == 2 and int(row["jobs"]) == 2
        for m in METRICS + ("train_time_s",):
            values = [j[m] for j in jobs]
            assert float(row[f"{m}_mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12), m
            assert float(row[f"{m}_std"]) == pytest.approx(statistics.stdev(values), rel=1e-12), m
            assert int(row[f"{m}_n"]) == 2
        assert row["rho"] == ("" if variant == "base" else "0.05")
    md = (reported / "report.md").read_text()
    assert "4 jobs: 4 completed, 0 diverged, 0 failed, 0 missing" in md
    assert "| optimizer=sam | sam | 0.05 | 2 |" in md and "train_time_s" in md


def test_a_metric_not_in_the_summary_is_its_last_logged_value(reported):
    rows = {r["variant"]: r for r in csv_rows(reported / "report.csv")}
    jobs = sorted(p for p in shared_sweep().iterdir() if p.is_dir())
    last = {}
    for job in jobs:
        rows_ = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        overrides = json.loads((job / "summary.json").read_text())["overrides"]
        last.setdefault(next(o.split("=")[1] for o in overrides if o.startswith("optimizer=")), []).append(
            [r["train_loss"] for r in rows_ if "train_loss" in r][-1])
    for variant, values in last.items():
        assert float(rows[variant]["train_loss_mean"]) == pytest.approx(statistics.fmean(values))


def test_every_png_decodes_as_an_image(reported):
    from PIL import Image
    pngs = sorted(reported.glob("*.png")) + sorted(shared_sweep().glob("*/curves.png"))
    names = {p.name for p in pngs}
    assert {"acc_vs_rho.png", "lambda_max_vs_rho.png", "ece_vs_rho.png", "acc_vs_lambda_max.png", "curves.png"} <= names
    for p in pngs:
        with Image.open(p) as im:
            im.load()
            assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    assert all(f"]({name})" in (reported / "report.md").read_text() for name in names - {"curves.png"})


def test_a_running_job_is_reported_missing_and_left_out_of_the_means(tmp_path):
    sweep = copy_sweep(tmp_path / "sweep")
    running = sorted(p for p in sweep.iterdir() if p.is_dir())[-1]  # the last job: no summary yet
    (running / "summary.json").unlink()
    report = build_report(sweep)
    assert report.counts() == {"completed": 3, "missing": 1}
    sam = next(g for g in report.groups if g["variant"] == "sam")
    assert sam["completed"] == 1 and sam["missing"] == 1 and sam["stats"]["test_acc"]["n"] == 1
    assert main([str(sweep)]) == 0
    md = (sweep / "report.md").read_text()
    assert "1 missing (1 running or killed, 0 not started)" in md
    assert f"`{running.name}`" in md and "running, or killed" in md


def test_a_sweep_with_a_failed_job_is_reported_not_crashed_on(tmp_path):
    """A real sweep whose second job fails (ρ < 0 is a config error)."""
    sweep = tmp_path / "failing"
    args = [a for a in SWEEP_ARGS if not a.startswith(("optimizer=", "seed=", "logger"))]
    subprocess.run(["sam-run", *args, "optimizer=sam", "optimizer.rho=0.05,-1", "metrics.hessian.enabled=false",
                    f"hydra.sweep.dir={sweep}"], capture_output=True, text=True, timeout=600)
    proc = subprocess.run(["sam-report", str(sweep)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("2 jobs: 1 completed, 0 diverged, 1 failed, 0 missing;")
    md = (sweep / "report.md").read_text()
    assert "**failed**" in md and "optimizer.rho=-1" in md and "must be a finite number >= 0" in md
    rows = {r["rho"]: r for r in csv_rows(sweep / "report.csv")}
    assert (rows["0.05"]["completed"], rows["-1"]["failed"]) == ("1", "1")
    assert rows["-1"]["test_acc_mean"] == "" and rows["-1"]["test_acc_n"] == "0"
    assert rows["0.05"]["test_acc_n"] == "1" and rows["0.05"]["test_acc_std"] == ""


def test_a_job_that_has_not_started_is_named_as_missing(tmp_path, capsys):
    sweep = copy_sweep(tmp_path / "sweep")
    gone = sorted(p for p in sweep.iterdir() if p.is_dir())[1]
    overrides = json.loads((gone / "summary.json").read_text())["overrides"]
    shutil.rmtree(gone)  # the launcher has not got to it yet
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "4 jobs: 3 completed, 0 diverged, 0 failed, 1 missing (0 running or killed, 1 not started)" in out
    assert f"missing: (no folder) {' '.join(overrides)} (not started" in out
    base = next(r for r in csv_rows(sweep / "report.csv") if r["variant"] == "base")
    assert (base["completed"], base["missing"], base["test_acc_n"]) == ("1", "1", "1")


def test_the_stability_bound_is_drawn_from_the_logged_gradient_norms(tmp_path):
    sweep = copy_sweep(tmp_path / "sweep")
    report = build_report(sweep)
    sam_jobs = [j for j in report.jobs if j.variant == "sam"]
    logged = all("grad_norm_max" in (j.path / "metrics.jsonl").read_text() for j in sam_jobs)
    if not logged:
        pytest.skip("the training loop does not log grad_norm_max yet")
    for job in sam_jobs:
        rows = [json.loads(line) for line in (job.path / "metrics.jsonl").read_text().splitlines()]
        gamma = max(r["grad_norm_max"] for r in rows if "grad_norm_max" in r)  # one epoch: all of it is "the end"
        assert job.bound == pytest.approx((job.batch_size * gamma / (2 * job.rho * job.lr ** 2)) ** (1 / 3))
    assert "drawn for 2 job(s)" in " ".join(report.notes)
    from sam_runner.plots import plot_metric_vs_rho
    fig = plot_metric_vs_rho(report.groups, "lambda_max", "λ_max", logy=True,
                             bounds={"sam": [b for g in report.groups for b in g["bounds"]]})
    assert any("stability bound" in label for label in fig.axes[0].get_legend_handles_labels()[1])


def test_bound_and_gamma_definitions():
    assert tlc_bound(128, 2.0, 0.05, 0.1) == pytest.approx((128 * 2.0 / (2 * 0.05 * 0.01)) ** (1 / 3))
    assert tlc_bound(128, None, 0.05, 0.1) is None and tlc_bound(128, 2.0, 0.0, 0.1) is None
    rows = [{"epoch": e, "grad_norm_max": g} for e, g in [(1, 9.0), (10, 1.0), (18, 3.0), (19, 2.0), (20, 1.5)]]
    assert gamma_near_end(rows) == 2.0  # epochs 19-20 are the last 10% of 20; epoch 18 is not
    assert gamma_near_end(rows[:2]) == 1.0 and gamma_near_end([{"epoch": 1}]) is None


def test_groups_pool_seeds_and_settings_that_do_not_change_the_experiment():
    key = group_overrides(["optimizer=sam", "seed=3", "trainer.device=cpu", "hydra.launcher.timeout_min=9",
                           "hydra/launcher=submitit_slurm", "+logger=wandb", "logger.mode=offline",
                           "optimizer.rho=0.1", "dataset.batch_size=64"], ignore=("dataset.batch_size",))
    assert key == ("optimizer=sam", "optimizer.rho=0.1")


def test_a_folder_that_is_not_a_sweep_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sam-report: error: sweep folder") and "\n" not in err
    assert main([str(tmp_path)]) == 2
    assert "no jobs in" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
