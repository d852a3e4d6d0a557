"""The report of a search of several objectives (results/search.py): trials.csv with one column
per objective, pareto.csv holding exactly the non-dominated completed trials (recomputed here),
pareto.png, importances.csv and the search lines of report.md."""

from __future__ import annotations

import csv
import itertools
import math
import os
import subprocess
import sys

import optuna
import pytest

from sam_runner.results.search import write_search_report
from sam_runner.runfiles import write_json
from sam_runner.sweep.study import open_storage

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def non_dominated(rows: list[dict], keys: list[str], ways: list[str]) -> set[int]:
    """Trial numbers of the rows no other row dominates, from the csv's own numbers."""
    signs = {k: 1 if w == "maximize" else -1 for k, w in zip(keys, ways)}
    score = {int(r["number"]): [signs[k] * float(r[k]) for k in keys] for r in rows}

    def beats(b, a) -> bool:
        return all(y >= x for x, y in zip(a, b)) and any(y > x for x, y in zip(a, b))

    return {n for n, a in score.items() if not any(beats(b, a) for m, b in score.items() if m != n)}


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_pareto_csv_is_the_non_dominated_completed_trials(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="search",
        directions=["maximize", "minimize"],
        storage=open_storage(tmp_path, None),
    )
    study.set_user_attr("objectives", ["val_acc", "lambda_max"])  # as the sweeper records
    space = {
        "optimizer.rho": optuna.distributions.FloatDistribution(0.01, 0.5, log=True),
        "base_optimizer.lr": optuna.distributions.FloatDistribution(0.01, 0.5, log=True),
    }
    grid = [(a, l) for a, l in itertools.product((0.5, 0.6, 0.7, 0.8), (4.0, 9.0, 2.0))]
    grid += [(-math.inf, math.inf)]  # a failed trial: the worst of both, never on the front
    for acc, lam in grid:
        t = study.ask(space)
        study.tell(t, [acc, lam])
        status = "completed" if math.isfinite(acc) else "failed"
        write_json(tmp_path / str(t.number) / "summary.json", {"status": status, "epochs": 2})
    paths = write_search_report(tmp_path)
    assert {p.name for p in paths} >= {"trials.csv", "pareto.csv", "pareto.png", "importances.csv"}
    trials = read_csv(tmp_path / "trials.csv")
    assert list(trials[0]) == [
        "number",
        "state",
        "job_dir",
        "optimizer.rho",
        "base_optimizer.lr",
        "val_acc",
        "lambda_max",
    ]
    finite = [r for r in trials if math.isfinite(float(r["val_acc"]))]
    expected = non_dominated(finite, ["val_acc", "lambda_max"], ["maximize", "minimize"])
    front = read_csv(tmp_path / "pareto.csv")
    assert {int(r["number"]) for r in front} == expected == {11}  # acc 0.8 at lambda_max 2
    assert front == [r for r in trials if int(r["number"]) in expected]  # the same columns
    importances = read_csv(tmp_path / "importances.csv")
    assert {r["objective"] for r in importances} == {"val_acc", "lambda_max"}
    assert {r["param"] for r in importances} == {"optimizer.rho", "base_optimizer.lr"}
    md = (tmp_path / "search.md").read_text()
    assert "## Pareto front: 1 trial(s)" in md and "![pareto](pareto.png)" in md
    assert "13 trial(s) (12 completed, 1 failed); objective val_acc (maximize), lambda_max" in md


@pytest.mark.slow  # a 6-trial search of real jobs (~1 min on a shared 2-core machine)
def test_the_acc_vs_sharpness_preset_reports_its_pareto_front(tmp_path):
    sweep = tmp_path / "search"
    cmd = [sys.executable, "-m", "sam_runner.cli", "-m", "hparams_search=sam_acc_vs_sharpness"]
    cmd += ["dataset.num_samples=1200", "dataset.batch_size=64", "trainer.device=cpu"]
    cmd += ["metrics.hessian.num_samples=256", "metrics.hessian.max_iter=20"]
    cmd += ["trainer.progress=none", "trainer.epochs=2", f"dataset.data_dir={tmp_path}"]
    cmd += ["hydra.sweeper.n_trials=6", f"hydra.sweep.dir={sweep}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trial(s) on the Pareto front of val_acc (maximize), lambda_max (minimize)" in out.stdout
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert study.user_attrs["objectives"] == ["val_acc", "lambda_max"]
    assert {"optimizer", "optimizer.rho", "base_optimizer.lr"} == set(study.trials[0].params)
    report = subprocess.run(
        [sys.executable, "-m", "sam_runner.results.report", str(sweep)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    trials = read_csv(sweep / "trials.csv")
    assert len(trials) == 6 and all(r["state"] == "COMPLETE" for r in trials)
    for r in trials:  # each objective is the job's own number
        import json

        summary = json.loads((sweep / r["job_dir"] / "summary.json").read_text())
        assert float(r["val_acc"]) == summary["val_acc"]
        assert float(r["lambda_max"]) == summary["lambda_max"]
    expected = non_dominated(trials, ["val_acc", "lambda_max"], ["maximize", "minimize"])
    front = read_csv(sweep / "pareto.csv")
    assert {int(r["number"]) for r in front} == expected
    assert {t.number for t in study.best_trials} == expected  # Optuna's own front agrees
    assert (sweep / "pareto.png").stat().st_size > 0
    assert "Pareto front: #" in (sweep / "report.md").read_text()


def test_pruned_trials_rank_after_completed_ones_and_their_saved_epochs_are_said(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="search", direction="maximize", storage=open_storage(tmp_path, None)
    )
    space = {"optimizer.rho": optuna.distributions.FloatDistribution(0.01, 0.5, log=True)}
    # (value, pruned at epoch or None) of 3-epoch trials: the pruned one stopped high
    for value, stop in ((0.5, None), (0.9, 1), (0.6, None)):
        t = study.ask(space)
        t.report(value, 1)
        summary = {"status": "completed", "epochs": 3, "val_acc": value, "objective": "val_acc"}
        if stop:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            summary.update(status="pruned", epochs=stop, pruned_epoch=stop, planned_epochs=3)
        else:
            study.tell(t, value)
        write_json(tmp_path / str(t.number) / "summary.json", summary)
    write_search_report(tmp_path)
    md = (tmp_path / "search.md").read_text()
    assert "3 trial(s) (2 completed, 1 pruned); objective val_acc (maximize)." in md
    assert "Pruning stopped 1 trial(s) early and saved 2 of 9 epochs (22%)" in md
    rows = [r.split(",")[:3] for r in (tmp_path / "search.csv").read_text().splitlines()[1:]]
    assert rows == [["1", "2", "completed"], ["2", "0", "completed"], ["3", "1", "pruned"]]
    assert "## Best trial: #2" in md
    assert read_csv(tmp_path / "trials.csv")[1]["state"] == "PRUNED"
