"""Searches (hparams_search=...): checks before anything runs, a trial's objective, and a
4-trial Optuna search killed during trial 3 that the same command finishes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest
from conftest import compose, wait_for

from sam_runner.errors import UserError
from sam_runner.preflight import preflight
from sam_runner.sweep.hydra_api import search_space
from sam_runner.sweep.objective import job_value
from sam_runner.sweep.study import open_storage

ENV = dict(os.environ, OMP_NUM_THREADS="1")
TINY = [
    "dataset.num_samples=1200",
    "dataset.batch_size=64",
    "metrics.hessian.enabled=false",
    "trainer.device=cpu",
    "trainer.progress=none",
]


def refused(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        preflight(["-m", "hparams_search=sam_rho_lr", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


def test_a_bad_bound_is_named_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "base_optimizer.lr=interval(-0.1, 0.5)")
    assert err == (
        "sam-run: error: the search space base_optimizer.lr=interval(-0.1, 0.5): its bound "
        "base_optimizer.lr=-0.1 is refused: base_optimizer.lr=-0.1 must be a finite number > 0"
    )
    assert "optimizer.rho=-1 is refused" in refused(capsys, "optimizer.rho=choice(0.1,-1)")
    assert "needs bounds > 0" in refused(capsys, "optimizer.rho=tag(log, interval(0, 0.5))")
    assert "not below" in refused(capsys, "optimizer.rho=interval(0.5, 0.1)")
    assert "optimizer=base ignores optimizer.rho" in refused(capsys, "optimizer=base")
    assert not (tmp_path / "multirun").exists()  # nothing written


def test_a_search_without_a_validation_split_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "dataset.val_split=0")
    assert "set dataset.val_split" in err and "trainer.objective=test_acc" in err
    # naming a test metric explicitly is allowed (and marked in the summary)
    argv = preflight(
        ["-m", "hparams_search=sam_rho_lr", "dataset.val_split=0", "trainer.objective=test_acc"]
    )
    assert argv[-1].startswith("hydra.sweep.dir=multirun/")
    # the same command lands in the same folder; n_trials does not change it
    again = preflight(
        [
            "-m",
            "hparams_search=sam_rho_lr",
            "dataset.val_split=0",
            "trainer.objective=test_acc",
            "hydra.sweeper.n_trials=9",
        ]
    )
    assert again[-1] == argv[-1]


def test_search_space_bounds_and_log_tags():
    space = search_space(
        [
            "optimizer.rho=tag(log, interval(0.01, 0.5))",
            "seed=range(0,4)",
            "optimizer=choice(sam,gear_sam)",
            "trainer.epochs=3",
        ]
    )
    assert [(s.key, s.bounds, s.log) for s in space] == [
        ("optimizer.rho", ["0.01", "0.5"], True),
        ("seed", ["0", "3"], False),
        ("optimizer", ["sam", "gear_sam"], False),
    ]


def test_a_diverged_trial_returns_the_worst_value(tmp_path):
    from sam_runner.train import train

    cfg = compose(
        "model=mlp",
        *TINY,
        f"dataset.data_dir={tmp_path}",
        "dataset.val_split=0.1",
        "trainer.epochs=1",
        "base_optimizer.lr=1e9",
        "scheduler=constant",
    )
    summary = train(cfg, tmp_path / "run", [])
    assert summary["status"] == "diverged"
    assert job_value(cfg, tmp_path / "run", summary) == -math.inf
    cfg.trainer.objective = "val_loss"  # minimised: its worst is +inf
    assert job_value(cfg, tmp_path / "run", summary) == math.inf
    done = {"status": "completed", "val_acc": 0.5, "test_acc": 0.4}
    cfg.trainer.objective = "test_acc"
    assert job_value(cfg, tmp_path / "run", done) == 0.4
    cfg.trainer.objective = "val_accuracy"  # misspelt: one line naming the keys there are
    with pytest.raises(UserError, match=r"trainer.objective=val_accuracy is not a key .*val_acc"):
        job_value(cfg, tmp_path / "run", done)


@pytest.mark.slow
def test_sigkill_during_trial_3_then_the_same_command_ends_with_4_trials(tmp_path):
    import optuna

    sweep = tmp_path / "search"
    args = [
        "-m",
        "hparams_search=sam_rho_lr",
        *TINY,
        "dataset.num_samples=2000",
        "trainer.epochs=2",
        f"dataset.data_dir={tmp_path}",
        "hydra.sweeper.n_trials=4",
        f"hydra.sweep.dir={sweep}",
    ]
    cmd = [sys.executable, "-m", "sam_runner.cli", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=ENV
    )
    ckpt = sweep / "2" / "checkpoints" / "last.pt"
    wait_for(ckpt.exists, "trial 3's first checkpoint", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (sweep / "2" / "summary.json").exists(), "trial 3 ended before the kill"
    before = {n: (sweep / n / "metrics.jsonl").read_bytes() for n in ("0", "1")}

    again = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"resuming {sweep / '2'} from epoch 1" in again.stderr  # from its checkpoint
    assert "trial #0 of" not in again.stdout and "trial #1 of" not in again.stdout  # not rerun
    assert {n: (sweep / n / "metrics.jsonl").read_bytes() for n in ("0", "1")} == before
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE"] * 4
    # the resumed sampler draws new values, not the first trials' again
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 4
    for t in study.trials:
        summary = json.loads((sweep / str(t.number) / "summary.json").read_text())
        assert summary["status"] == "completed" and t.value == summary["val_acc"]
        assert set(summary["overrides"][:2]) == {f"{k}={v}" for k, v in t.params.items()}
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1", "2", "3"]
    assert "best trial #" in again.stdout
    for t in study.trials[2:]:  # each trial's line gives the objective it is selected on (#42)
        assert f"trial #{t.number}: val_acc={t.value:.4f} (maximize)\n" in again.stdout

    other = subprocess.run(
        [*cmd, "optimizer.rho=tag(log, interval(0.02, 0.2))"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert other.returncode == 2 and "holds the Optuna study of another search" in other.stderr
    assert other.stderr.strip().count("\n") == 0, other.stderr

    from sam_runner.results.report import main as report_main

    assert report_main([str(sweep)]) == 0
    md = (sweep / "search.md").read_text()
    best = max(study.trials, key=lambda t: t.value)
    assert f"| 1 | {best.number} | completed |" in md and f"## Best trial: #{best.number}" in md
    assert (sweep / "search_optimizer.rho.png").stat().st_size > 0


def test_search_report_ranks_trials_and_puts_failed_ones_last(tmp_path):
    import optuna

    from sam_runner.results.search import write_search_report
    from sam_runner.runfiles import write_json

    study = optuna.create_study(
        study_name="search", direction="maximize", storage=open_storage(tmp_path, None)
    )
    space = {"optimizer.rho": optuna.distributions.FloatDistribution(0.01, 0.5, log=True)}
    for value in (0.5, -math.inf, 0.7):
        t = study.ask(space)
        study.tell(t, value)
        status = "completed" if math.isfinite(value) else "diverged"
        summary = {
            "status": status,
            "objective": "val_acc",
            "val_acc": value,
            "test_acc": 0.6,
            "test_loss": 1.0,
            "overrides": [f"optimizer.rho={t.params['optimizer.rho']}"],
        }
        write_json(tmp_path / str(t.number) / "summary.json", summary)
    paths = write_search_report(tmp_path)
    rows = (tmp_path / "search.csv").read_text().splitlines()
    assert [r.split(",")[:3] for r in rows[1:]] == [
        ["1", "2", "completed"],
        ["2", "0", "completed"],
        ["3", "1", "diverged"],
    ]
    assert (tmp_path / "trials.csv").read_text().splitlines() == [
        "number,state,job_dir,optimizer.rho,val_acc",
        *(
            f"{t.number},COMPLETE,{t.number},{t.params['optimizer.rho']},{t.value}"
            for t in study.trials
        ),
    ]
    md = (tmp_path / "search.md").read_text()
    assert "## Best trial: #2" in md and "| acc | 0.7 | 0.6 |" in md
    assert "optimizer.rho (log)" not in md and paths[-1].name == "search_optimizer.rho.png"


def test_sweep_lines_refuses_a_search_in_one_line(capsys):
    from sam_runner.sweep.lines import lines_main

    with pytest.raises(SystemExit) as e:
        lines_main(["hparams_search=sam_rho_lr"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "run it with sam-run -m" in err


@pytest.mark.slow
def test_two_sweepers_of_one_study_at_once_never_run_a_trial_twice(tmp_path):
    import optuna

    sweep = tmp_path / "search"
    cmd = [
        sys.executable,
        "-m",
        "sam_runner.cli",
        "-m",
        "hparams_search=sam_rho_lr",
        *TINY,
        "trainer.epochs=1",
        f"dataset.data_dir={tmp_path}",
        "hydra.sweeper.n_trials=4",
        f"hydra.sweep.dir={sweep}",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    ran = [line for o in outs for line in o[0].splitlines() if line.startswith("trial #")]
    assert sorted(line.split()[1] for line in ran) == ["#0", "#1", "#2", "#3"]  # each once
    for t in study.trials:
        lines = (sweep / str(t.number) / "metrics.jsonl").read_text().splitlines()
        summary = json.loads((sweep / str(t.number) / "summary.json").read_text())
        assert t.value == summary["val_acc"] and len([x for x in lines if "test_acc" in x]) == 1


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["hydra.sweeper.pruner=fast"],
            "hydra.sweeper.pruner=fast is unknown; choose one of none, median, asha, hyperband",
        ),
        (
            ["hydra.sweeper.sampler.name=grid"],
            "hydra.sweeper.sampler.name=grid is unknown; choose one of tpe",
        ),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 must be an integer >= 1"),
        (
            ["hydra.sweeper.directions=[maximize,minimize]"],
            "hydra.sweeper.directions has 2 direction(s) (maximize, minimize) and "
            "trainer.objective 1 key(s) (val_acc)",
        ),
        (
            ["hydra.sweeper.pruner=asha", "trainer.objective=[val_acc,lambda_max]"],
            "hydra.sweeper.pruner=asha cannot prune a search of 2 objectives",
        ),
        (
            ["hydra.sweeper.pruner=asha", "hydra.sweeper.pruning.reduction_factor=0"],
            "hydra.sweeper.pruning.reduction_factor=0 must be a whole number >= 1",
        ),
        (
            ["trainer.objective=val_accuracy"],
            "trainer.objective=val_accuracy is never logged by this run (did you mean val_acc?); "
            "it logs test_acc,",
        ),
        (
            ["trainer.objective=lambda_max", "metrics.hessian.enabled=false"],
            "trainer.objective=lambda_max is never logged by this run with these "
            "metrics.hessian settings",
        ),
        (["optimizer.rho=choice()"], "the search space optimizer.rho=choice() holds no value"),
        (
            ["optimizer.rhoo=interval(0.01, 0.5)"],
            "optimizer.rhoo is not a key of optimizer=sam; did you mean optimizer.rho?",
        ),
    ],
)
def test_bad_search_settings_are_one_line_before_anything_is_written(
    argv, said, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert said in refused(capsys, *argv)
    assert list(tmp_path.iterdir()) == []  # no sweep folder, no study


def test_the_keys_a_run_logs_follow_its_settings():
    from sam_runner.sweep.objective import logged_keys

    keys = logged_keys(compose("dataset.val_split=0.1"))
    assert {"val_acc", "best_val_acc", "lambda_max", "test_acc"} <= set(keys)
    keys = logged_keys(compose("metrics.hessian.enabled=false", "metrics.hessian.k=3"))
    assert "lambda_max" not in keys and "val_acc" not in keys
    assert "lambda_3" in logged_keys(compose("metrics.hessian.k=3"))


@pytest.mark.parametrize(
    ("objective", "refused"),
    [("test_acc", None), ("[test_acc,val_loss]", "val_loss"), ("val_acc", "val_acc")],
)
def test_an_objective_on_a_validation_split_needs_one(objective, refused):
    from sam_runner.sweep.objective import validate

    cfg = compose(f"trainer.objective={objective}")
    if refused is None:
        validate(cfg)
        validate(compose("trainer.objective=val_acc", "dataset.val_split=0.1"))
        return
    with pytest.raises(UserError, match=f"trainer.objective={refused} is measured on a valid"):
        validate(cfg)
