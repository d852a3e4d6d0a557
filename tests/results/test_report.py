"""sam-report on a real sweep: the table's numbers, the CSV, the plots, unfinished and failed
jobs."""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess

import pytest
import yaml
from results_helpers import SWEEP_ARGS, copy_sweep, living_children, shared_sweep

from sam_runner.results.report import build_report, main
from sam_runner.results.sweep import group_overrides, near_end, tlc_bound

METRICS = ("test_acc", "test_ece", "test_nll", "lambda_max")


def summaries(sweep):
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]


def csv_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert (
        main(
            [
                str(shared_sweep()),
                "--out",
                str(out),
                "--metric",
                "train_time_s",
                "--metric",
                "train_loss",
            ]
        )
        == 0
    )
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
        last.setdefault(
            next(o.split("=")[1] for o in overrides if o.startswith("optimizer=")), []
        ).append([r["train_loss"] for r in rows_ if "train_loss" in r][-1])
    for variant, values in last.items():
        assert float(rows[variant]["train_loss_mean"]) == pytest.approx(statistics.fmean(values))


def test_every_png_decodes_as_an_image(reported):
    from PIL import Image

    pngs = sorted(reported.glob("*.png")) + sorted(shared_sweep().glob("*/curves.png"))
    names = {p.name for p in pngs}
    assert {
        "acc_vs_rho.png",
        "lambda_max_vs_rho.png",
        "ece_vs_rho.png",
        "acc_vs_lambda_max.png",
        "curves.png",
    } <= names
    for p in pngs:
        with Image.open(p) as im:
            im.load()
            assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    assert all(
        f"]({name})" in (reported / "report.md").read_text() for name in names - {"curves.png"}
    )


def test_plots_format_writes_every_figure_as_svg_and_refuses_other_formats(tmp_path, capsys):
    """plots.format=svg, a word among the folders: every figure of the report is an SVG, and
    report.md links them; an unknown format is one line, exit 2, and nothing is written."""
    out = tmp_path / "svg"
    assert main([str(shared_sweep()), "plots.format=svg", "--out", str(out)]) == 0
    figures = {p.name for p in out.iterdir() if p.suffix in (".png", ".svg", ".pdf")}
    assert figures >= {"acc_vs_rho.svg", "lambda_max_vs_rho.svg", "acc_vs_lambda_max.svg"}
    assert all(name.endswith(".svg") for name in figures)
    assert all((out / n).read_text().startswith("<?xml") for n in figures)
    md = (out / "report.md").read_text()
    assert "](lambda_max_vs_rho.svg)" in md and ".png)" not in md
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main([str(shared_sweep()), "plots.format=jpg", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == "sam-report: error: plots.format='jpg' is unknown; choose one of png, pdf, svg\n"
    assert not bad.exists()


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
    (running / "summary.json").write_text('{"status": "compl')  # a write cut short
    assert main([str(sweep)]) == 0
    md = (sweep / "report.md").read_text()
    assert "1 missing (0 running or killed, 1 with an unreadable summary.json, 0 not started)" in md
    assert "summary.json is corrupt (not JSON" in md


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
def test_a_sweep_with_a_failed_job_is_reported_not_crashed_on(tmp_path):
    """A real sweep whose second job fails (a batch larger than the training set of 800: only
    the data tells, so the job runs and fails)."""
    sweep = tmp_path / "failing"
    args = [a for a in SWEEP_ARGS if not a.startswith(("optimizer=", "seed=", "logger"))]
    subprocess.run(
        [
            "sam-run",
            *args,
            "optimizer=sam",
            "dataset.batch_size=64,5000",
            "metrics.hessian.enabled=false",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    proc = subprocess.run(["sam-report", str(sweep)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("2 jobs: 1 completed, 0 diverged, 1 failed, 0 missing;")
    md = (sweep / "report.md").read_text()
    assert (
        "**failed**" in md
        and "dataset.batch_size=5000" in md
        and "larger than the training set" in md
    )
    rows = {r["group"]: r for r in csv_rows(sweep / "report.csv")}
    ok = next(r for g, r in rows.items() if "batch_size=64" in g)
    bad = next(r for g, r in rows.items() if "batch_size=5000" in g)
    assert (ok["completed"], bad["failed"]) == ("1", "1")
    assert bad["test_acc_mean"] == "" and bad["test_acc_n"] == "0"
    assert ok["test_acc_n"] == "1" and ok["test_acc_std"] == ""


def test_a_job_that_has_not_started_is_named_as_missing(tmp_path, capsys):
    sweep = copy_sweep(tmp_path / "sweep")
    gone = sorted(p for p in sweep.iterdir() if p.is_dir())[1]
    overrides = json.loads((gone / "summary.json").read_text())["overrides"]
    shutil.rmtree(gone)  # the launcher has not got to it yet
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert (
        "4 jobs: 3 completed, 0 diverged, 0 failed, 1 missing (0 running or killed, 1 not started)"
        in out
    )
    varying = [o for o in overrides if o.split("=")[0] in ("optimizer", "seed")]
    assert f"missing: (no folder) {' '.join(varying)} (not started" in out  # what sets it apart
    base = next(r for r in csv_rows(sweep / "report.csv") if r["variant"] == "base")
    assert (base["completed"], base["missing"], base["test_acc_n"]) == ("1", "1", "1")


def test_the_stability_bound_is_drawn_from_the_logged_gradient_norms(tmp_path):
    sweep = copy_sweep(tmp_path / "sweep")
    report = build_report(sweep)
    sam_jobs = [j for j in report.jobs if j.variant == "sam"]
    for job in sam_jobs:
        assert "grad_norm_max" in (job.path / "metrics.jsonl").read_text()  # always logged
        rows = [json.loads(line) for line in (job.path / "metrics.jsonl").read_text().splitlines()]
        # one epoch: all of it is "the end"
        gamma = max(r["grad_norm_max"] for r in rows if "grad_norm_max" in r)
        assert job.bound == pytest.approx(
            (job.batch_size * gamma / (2 * job.rho * job.lr**2)) ** (1 / 3)
        )
    # a sweep without TLC-SAM: the bound is computed (report.csv) but not shown or said
    assert not report.bound_shown and "Stability bound" not in " ".join(report.notes)
    from sam_runner.plots.sweep import plot_metric_vs_rho

    fig = plot_metric_vs_rho(report.groups, "lambda_max", "λ_max", logy=True, bounds=True)
    assert any("stability bound" in label for label in fig.axes[0].get_legend_handles_labels()[1])


def test_bound_and_gamma_definitions():
    assert tlc_bound(128, 2.0, 0.05, 0.1) == pytest.approx(
        (128 * 2.0 / (2 * 0.05 * 0.01)) ** (1 / 3)
    )
    assert tlc_bound(128, None, 0.05, 0.1) is None and tlc_bound(128, 2.0, 0.0, 0.1) is None
    rows = [
        {"epoch": e, "grad_norm_max": g}
        for e, g in [(1, 9.0), (10, 1.0), (18, 3.0), (19, 2.0), (20, 1.5)]
    ]
    # epochs 19-20 are the last 10% of 20; epoch 18 is not
    assert near_end(rows, "grad_norm_max") == 2.0
    assert (
        near_end(rows[:2], "grad_norm_max") == 1.0
        and near_end([{"epoch": 1}], "grad_norm_max") is None
    )
    rows = [dict(r, rho=0.05 * r["epoch"]) for r in rows]
    assert near_end(rows, "rho", statistics.fmean) == pytest.approx(0.05 * 19.5)  # the same window


def test_groups_pool_seeds_and_settings_that_do_not_change_the_experiment():
    key = group_overrides(
        [
            "optimizer=sam",
            "seed=3",
            "trainer.device=cpu",
            "hydra.launcher.timeout_min=9",
            "trainer.compile=true",
            "trainer.channels_last=false",
            "hydra/launcher=submitit_slurm",
            "+logger=wandb",
            "logger.mode=offline",
            "optimizer.rho=0.1",
            "dataset.batch_size=64",
        ],
        ignore=("dataset.batch_size",),
    )
    assert key == ("optimizer=sam", "optimizer.rho=0.1")


def test_a_folder_that_is_not_a_sweep_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sam-report: error: sweep folder") and "\n" not in err
    before = living_children()
    assert main([str(tmp_path)]) == 2
    assert "no jobs in" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
    assert living_children() == before  # the drawing server it started is gone


@pytest.fixture(scope="module")
def tlc_sweep(tmp_path_factory):
    """A real sweep as a study preset runs one: base beside TLC-SAM under one optimizer.rho."""
    sweep = tmp_path_factory.mktemp("tlc") / "sweep"
    args = [
        a
        for a in SWEEP_ARGS
        if not a.startswith(("optimizer=", "seed=", "logger", "trainer.epochs="))
    ]
    proc = subprocess.run(
        [
            "sam-run",
            *args,
            "optimizer=base,tlc_sam",
            "optimizer.rho=0.1",
            "trainer.epochs=2",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


def test_base_has_no_rho_and_tlc_sams_bound_uses_the_rho_it_logged(tlc_sweep):
    report = build_report(tlc_sweep)
    base = next(g for g in report.groups if g["variant"] == "base")
    assert base["rho"] is None and base["bounds"] == [] and base["stats"]["bound"]["n"] == 0
    tlc = next(j for j in report.jobs if j.variant == "tlc_sam")
    last = [json.loads(line) for line in (tlc.path / "metrics.jsonl").read_text().splitlines()][-1]
    # the controller moved ρ from its start
    assert last["epoch"] == 2 and last["rho"] != pytest.approx(0.1)
    # two epochs: the window of Γ and ρ is the last one
    assert tlc.bound == pytest.approx(
        tlc_bound(tlc.batch_size, last["grad_norm_max"], last["rho"], tlc.lr)
    )
    assert "drawn for 1 job(s)" in " ".join(report.notes)


def test_the_table_compares_lambda_max_with_the_bound_in_numbers(tlc_sweep, tmp_path):
    assert main([str(tlc_sweep), "--out", str(tmp_path)]) == 0
    tlc = next(j for j in build_report(tlc_sweep).jobs if j.variant == "tlc_sam")
    lam = tlc.metrics["lambda_max"]
    rows = {r["variant"]: r for r in csv_rows(tmp_path / "report.csv")}
    assert (rows["base"]["rho"], rows["base"]["bound_n"], rows["base"]["bound_mean"]) == (
        "",
        "0",
        "",
    )
    assert float(rows["tlc_sam"]["bound_mean"]) == pytest.approx(tlc.bound)
    assert float(rows["tlc_sam"]["lambda_max_over_bound_mean"]) == pytest.approx(lam / tlc.bound)
    assert rows["tlc_sam"]["above_bound"] == str(int(lam > tlc.bound))
    md = (tmp_path / "report.md").read_text()
    assert "| bound | λ_max/bound | λ_max > bound |" in md
    assert "| optimizer=base | base | — |" in md and f"| {int(lam > tlc.bound)}/1 |" in md
    assert "the schedule's peak" in md  # which η the bound uses is said
    # what the bound is, said under the table where it appears
    table_end = md.index("`bound`: TLC-SAM's stability bound λ_max ≤ (bΓ/(2ρη²))^(1/3)")
    assert md.index("| bound | λ_max/bound |") < table_end < md.index("## Notes")


def test_a_job_rerun_with_how_it_runs_settings_still_answers_for_its_sweep_job(tmp_path):
    sweep = copy_sweep(tmp_path / "sweep")
    conf = yaml.safe_load((sweep / "multirun.yaml").read_text())
    # a part-done sweep rerun on the CPU
    conf["hydra"]["overrides"]["task"].append("trainer.device=cpu")
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(conf))
    overrides = sweep / "0" / ".hydra" / "overrides.yaml"
    overrides.write_text(
        yaml.safe_dump(yaml.safe_load(overrides.read_text()) + ["trainer.device=cpu"])
    )
    assert build_report(sweep).counts() == {"completed": 4}


def test_a_sweep_over_the_step_size_reports_its_edge_of_stability(tmp_path, capsys):
    """Full-batch GD at two step sizes, λ_max every 5 steps: eos.png and a table of λ_max/(2/η)
    over the last third of the steps, computed from the jobs' own lines."""
    from conftest import run_cli

    from sam_runner.results.eos import plateau, traces
    from sam_runner.results.report import write_report

    args = [
        "-m",
        "model=mlp",
        "model.hidden=[16]",
        "model.activation=tanh",
        "dataset.batch_size=full",
        "dataset.train_subset=200",
        "dataset.num_samples=600",
        "trainer.loss=mse",
        "optimizer=base",
        "base_optimizer.momentum=0",
        "base_optimizer.weight_decay=0",
        "scheduler=constant",
        "base_optimizer.lr=0.5,1.0",
        "trainer.steps=30",
        "trainer.eval_every_n_steps=30",
        "metrics.hessian.every_n_steps=5",
        "metrics.hessian.num_samples=200",
        "trainer.progress=none",
        f"hydra.sweep.dir={tmp_path}",
    ]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    report = build_report(tmp_path)
    found = traces(report)
    assert len(found) == 2 and all(len(t["steps"]) == 6 for t in found)
    paths = write_report(report)
    assert tmp_path / "eos.png" in paths
    md = (tmp_path / "report.md").read_text()
    assert "## Edge of stability" in md
    for t in found:
        lr = t["job"].lr
        rows = [
            json.loads(line) for line in (t["job"].path / "metrics.jsonl").read_text().splitlines()
        ]
        last = [
            r["lambda_max"] * lr / 2
            for r in rows
            if "lambda_max" in r and "train_loss" not in r and r["step"] >= 5 + (2 / 3) * 25
        ]
        assert plateau(t, "threshold") == pytest.approx(sum(last) / len(last))
        assert f"{plateau(t, 'threshold'):.3f}" in md


def test_the_missing_and_pruned_lists_show_the_overrides_that_vary(tmp_path, capsys):
    """sam-report's ``missing:`` and ``pruned:`` lines (and report.md's "Not completed") name
    each job by the overrides that set it apart, not by the settings every job shares (#42)."""
    shared = ["model=mlp", "trainer.epochs=3", "dataset.num_samples=500", "trainer.device=cpu"]
    jobs = [("0.05", 0, "completed"), ("0.1", 0, "pruned"), ("0.1", 1, None), ("0.2", 1, "failed")]
    for n, (lr, seed, status) in enumerate(jobs):
        folder = tmp_path / str(n)
        (folder / ".hydra").mkdir(parents=True)
        overrides = [f"base_optimizer.lr={lr}", *shared, f"seed={seed}"]
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        if status:
            summary = {"status": status, "test_acc": 0.5, "overrides": overrides}
            summary.update(pruned_epoch=1, planned_epochs=3, error="boom")
            (folder / "summary.json").write_text(json.dumps(summary))
    assert main([str(tmp_path)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  ")]
    assert lines == [
        "  pruned: 1 base_optimizer.lr=0.1 seed=0 (at epoch 1 of 3)",
        "  missing: 2 base_optimizer.lr=0.1 seed=1 (no summary.json: running, or killed (last "
        "logged epoch 0))",
    ]
    md = (tmp_path / "report.md").read_text()
    assert "- `3` base_optimizer.lr=0.2 seed=1: **failed** — boom" in md
    assert "- `2` base_optimizer.lr=0.1 seed=1: **missing**" in md


def test_a_report_again_removes_the_files_of_what_no_longer_applies(tmp_path):
    """The files the last report wrote and this one does not (here the fine-tuning section's,
    once its jobs are gone) are removed; a file the report never wrote is kept."""
    from test_fine_tuning_report import _sweep

    _sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert (out / "fine_tuning.csv").is_file() and (out / "fine_tuning.png").is_file()
    (out / "notes.txt").write_text("mine")
    shutil.rmtree(tmp_path / "sweep" / "finetune")
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert not (out / "fine_tuning.csv").exists() and not (out / "fine_tuning.png").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "report.md").is_file()
    recorded = json.loads((out / ".sam-report-files.json").read_text())["files"]
    assert "report.md" in recorded and "fine_tuning.csv" not in recorded


def test_a_report_again_reads_a_job_whose_config_changed_anew(tmp_path):
    """The second report reuses the jobs' YAML as the first parsed it (.sam-report-cache.json)
    only while their files are unchanged: a job's ρ edited in its config.yaml is reported."""
    sweep = copy_sweep(tmp_path / "sweep")
    assert main([str(sweep)]) == 0
    assert (sweep / ".sam-report-cache.json").is_file()
    before = {r["group"]: r for r in csv_rows(sweep / "report.csv")}
    for config in sweep.glob("*/.hydra/config.yaml"):  # the SAM jobs' (both seeds)
        tree = yaml.safe_load(config.read_text())
        tree["optimizer"]["rho"] = 0.5
        config.write_text(yaml.safe_dump(tree, sort_keys=False))
    assert main([str(sweep)]) == 0
    after = {r["group"]: r for r in csv_rows(sweep / "report.csv")}
    assert before.keys() == after.keys()
    assert sorted(r["rho"] for r in before.values()) == ["", "0.05"]
    assert sorted(r["rho"] for r in after.values()) == ["", "0.5"]  # base: no ρ
