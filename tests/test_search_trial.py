"""Pruning (sweep/trial.py): each job of a pruned search reports trainer.objective after every
evaluation to its trial in the shared journal, and stops when the search's pruner says so; a
pruned trial is a result (kept, told pruned, not run again, not a failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest
from conftest import compose

from sam_runner.sweep.study import make_pruner, open_storage, pruner_settings
from sam_runner.sweep.trial import TrialLink, env_overrides

ENV = dict(os.environ, OMP_NUM_THREADS="1")
TINY = [
    "dataset.num_samples=1200",
    "dataset.batch_size=64",
    "metrics.hessian.enabled=false",
    "trainer.device=cpu",
    "trainer.progress=none",
]


@pytest.mark.parametrize(
    "name, optuna_name",
    [
        ("none", "NopPruner"),
        ("median", "MedianPruner"),
        ("asha", "SuccessiveHalvingPruner"),
        ("hyperband", "HyperbandPruner"),
    ],
)
def test_each_pruner_is_built_from_its_recorded_settings(name, optuna_name):
    conf = {"n_startup_trials": 5, "n_warmup_steps": 1, "min_resource": 1}
    conf.update(reduction_factor=3, max_resource="auto")
    settings = pruner_settings(name, conf, epochs=8)
    assert settings["name"] == name
    if name == "hyperband":
        assert settings["max_resource"] == 8  # auto: trainer.epochs
    assert type(make_pruner(settings)).__name__ == optuna_name
    assert json.loads(json.dumps(settings)) == settings  # a study user attribute as it is


def test_a_job_finds_its_trial_in_the_journal_and_is_pruned_below_the_median(tmp_path):
    """What a job does at each evaluation, against a real journal study: two finished trials
    at 0.8 per epoch, then one at 0.1 is stopped at the first epoch the warm-up allows."""
    study = optuna.create_study(
        study_name="search", direction="maximize", storage=open_storage(tmp_path, None)
    )
    study.set_user_attr(
        "pruner", pruner_settings("median", {"n_startup_trials": 2, "n_warmup_steps": 2}, 4)
    )
    x = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for _ in range(2):
        t = study.ask(x)
        for epoch in (1, 2, 3):
            t.report(0.8, epoch)
        study.tell(t, 0.8)
    low = study.ask(x)
    lines = env_overrides(tmp_path, None, "search", low.number)
    env = {
        line.split(".env_set.")[1].split("=")[0]: line.split("=", 1)[1].strip("'") for line in lines
    }
    os.environ.update(env)
    try:
        link = TrialLink.from_env()
    finally:
        for k in env:
            os.environ.pop(k)
    assert TrialLink.from_env() is None  # no search: no trial
    assert link.should_stop(1, 0.1) is False  # the warm-up epoch
    assert link.should_stop(2, float("nan")) is False  # nothing to report
    assert link.should_stop(2, 0.1) is True
    again = optuna.load_study(study_name="search", storage=open_storage(tmp_path, None))
    assert again.trials[low.number].intermediate_values == {1: 0.1, 2: 0.1}


@pytest.mark.slow  # a 5-trial search of 3 epochs each, then the same command again
def test_a_pruned_search_stops_trials_cleanly_and_does_not_rerun_them(tmp_path):
    from sam_runner.train import train

    sweep = tmp_path / "search"
    args = [
        "-m",
        "hparams_search=sam_rho_lr",
        *TINY,
        "trainer.epochs=3",
        f"dataset.data_dir={tmp_path}",
        "hydra.sweeper.n_trials=5",
        "hydra.sweeper.pruner=median",
        "hydra.sweeper.pruning.n_startup_trials=1",
        "hydra.sweeper.pruning.n_warmup_steps=0",
        f"hydra.sweep.dir={sweep}",
    ]
    cmd = [sys.executable, "-m", "sam_runner.cli", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    states = {t.number: t.state.name for t in study.trials}
    assert len(states) == 5 and set(states.values()) <= {"COMPLETE", "PRUNED"}
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert pruned, [dict(t.intermediate_values) for t in study.trials]  # seeded: some are
    assert study.user_attrs["pruner"] == {
        "name": "median",
        "n_startup_trials": 1,
        "n_warmup_steps": 0,
    }
    for t in study.trials:
        job = sweep / str(t.number)
        summary = json.loads((job / "summary.json").read_text())
        lines = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
        evaluated = [r["epoch"] for r in lines if "test_acc" in r]
        # every evaluation was reported to the trial, with the value the job logged
        assert t.intermediate_values == {r["epoch"]: r["val_acc"] for r in lines if "val_acc" in r}
        assert (job / "checkpoints" / "last.pt").is_file()  # kept, pruned or not
        if t.state.name == "PRUNED":
            stop = summary["pruned_epoch"]
            assert summary["status"] == "pruned" and evaluated == list(range(1, stop + 1))
            assert stop < 3 and summary["epochs"] == stop and summary["planned_epochs"] == 3
            assert summary["pruned_value"] == t.value == t.intermediate_values[stop]
            assert f"trial #{t.number} pruned at epoch {stop}" in out.stdout
        else:
            assert summary["status"] == "completed" and evaluated == [1, 2, 3]
    assert f"{5 - len(pruned)} completed, {len(pruned)} pruned" in out.stdout

    # the same command again: nothing runs, the study is as it was
    again = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert " of 5: " not in again.stdout  # no "trial #n of 5: ..." line: nothing launched
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert {t.number: t.state.name for t in study.trials} == states

    # a pruned job launched again (its sweeper killed before it told the study) trains no more
    first = pruned[0]
    job = sweep / str(first.number)
    before = (job / "metrics.jsonl").read_bytes()
    overrides = json.loads((job / "summary.json").read_text())["overrides"]
    cfg = compose(*[o for o in overrides if not o.startswith("hydra")])
    assert train(cfg, job, overrides)["status"] == "pruned"
    assert (job / "metrics.jsonl").read_bytes() == before

    # sam-report lists the pruned trials and counts none as failed
    report = subprocess.run(
        [sys.executable, "-m", "sam_runner.results.report", str(sweep)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"{len(pruned)} pruned, 0 failed" in report.stdout
    assert report.stdout.count("  pruned: ") == len(pruned)
    trials_csv = (sweep / "trials.csv").read_text()
    assert trials_csv.count(",PRUNED,") == len(pruned)


@pytest.mark.slow  # a pruned 4-trial search killed (-9) in trial 3, then the same command
def test_a_pruned_search_killed_mid_trial_ends_with_n_trials_each_run_once(tmp_path):
    import signal

    from conftest import wait_for

    sweep = tmp_path / "search"
    cmd = [sys.executable, "-m", "sam_runner.cli", "-m", "hparams_search=sam_rho_lr", *TINY]
    cmd += ["trainer.epochs=3", f"dataset.data_dir={tmp_path}", "hydra.sweeper.n_trials=4"]
    cmd += ["hydra.sweeper.pruner=median", "hydra.sweeper.pruning.n_startup_trials=1"]
    cmd += ["hydra.sweeper.pruning.n_warmup_steps=0", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=ENV
    )
    wait_for((sweep / "2" / "checkpoints" / "last.pt").exists, "trial 3's first checkpoint", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    again = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert len(study.trials) == 4
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    assert "trial #0 of" not in again.stdout and "trial #1 of" not in again.stdout
    for t in study.trials:
        job = sweep / str(t.number)
        lines = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
        epochs = [r["epoch"] for r in lines if "val_acc" in r]
        assert epochs == sorted(set(epochs))  # no epoch twice: resumed, never started over
        assert t.intermediate_values == {r["epoch"]: r["val_acc"] for r in lines if "val_acc" in r}
        status = json.loads((job / "summary.json").read_text())["status"]
        assert status == {"COMPLETE": "completed", "PRUNED": "pruned"}[t.state.name]


@pytest.mark.slow  # 4 trials, 2 at a time, each in its own submitit process (~2 min)
def test_jobs_in_worker_processes_report_to_their_trials(tmp_path):
    """hydra/launcher=submitit_local: each job is a process of its own, which finds its trial
    from its environment and writes to the sweep folder's journal itself."""
    sweep = tmp_path / "search"
    cmd = [sys.executable, "-m", "sam_runner.cli", "-m", "hparams_search=sam_rho_lr", *TINY]
    cmd += ["hydra/launcher=submitit_local", "hydra.sweeper.n_jobs=2", "trainer.epochs=3"]
    cmd += [f"dataset.data_dir={tmp_path}", "hydra.sweeper.n_trials=4"]
    cmd += ["hydra.sweeper.pruner=median", "hydra.sweeper.pruning.n_startup_trials=1"]
    cmd += ["hydra.sweeper.pruning.n_warmup_steps=0", f"hydra.sweep.dir={sweep}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert len(study.trials) == 4
    for t in study.trials:
        job = sweep / str(t.number)
        lines = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
        assert t.intermediate_values == {r["epoch"]: r["val_acc"] for r in lines if "val_acc" in r}
        assert t.intermediate_values  # written by the job's own process
