"""A search whose study is lost (its journal deleted, unreadable, cut short) is rebuilt from its
trial folders (#42): each folder's searched values and outcome become the trial of its number
again, and the same command goes on with the trials left."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import optuna
import pytest
import yaml
from conftest import run_cli

from sam_runner.errors import UserError
from sam_runner.runfiles import write_json
from sam_runner.sweep.plan import DEFAULT_EXCLUDE
from sam_runner.sweep.study import open_storage
from sam_runner.sweep.study_folders import add_folder_trials, trial_folders

RHO = optuna.distributions.FloatDistribution(0.01, 0.5, log=True)
OPT = optuna.distributions.CategoricalDistribution(["sam", "asam"])
FIXED = ["model=mlp", "trainer.epochs=3"]


def search(reports=True):
    return SimpleNamespace(
        space={"optimizer.rho": RHO, "optimizer": OPT},
        fixed=FIXED,
        keys=["val_acc"],
        ways=["maximize"],
        exclude=DEFAULT_EXCLUDE,
        reports=reports,
    )


def trial_folder(sweep, number, rho, status=None, opt="sam", rows=(), fixed=FIXED):
    """A trial folder as a search leaves it: its overrides, its evaluation lines, its summary
    (None: killed before the summary was written)."""
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    overrides = [f"optimizer.rho={rho}", f"optimizer={opt}", *fixed]
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    lines = [json.dumps({"epoch": e, "val_acc": v, "test_acc": 0.1}) for e, v in rows]
    (folder / "metrics.jsonl").write_text("".join(f"{x}\n" for x in lines))
    if status is not None:
        summary = {"status": status, "val_acc": rows[-1][1] if rows else None}
        write_json(folder / "summary.json", {**summary, "overrides": overrides})


def test_each_folder_becomes_the_trial_of_its_number(tmp_path):
    trial_folder(tmp_path, 0, 0.05, "completed", rows=[(1, 0.4), (2, 0.6)])
    trial_folder(tmp_path, 1, 0.2, "diverged", opt="asam")
    trial_folder(tmp_path, 2, 0.1, "pruned", rows=[(1, 0.2)])
    (tmp_path / "4").mkdir()  # 3 never began (a batch stopped first), 4 made and left empty
    trial_folder(tmp_path, 5, 0.3)  # killed while it trained
    study = optuna.create_study(direction="maximize")
    added = add_folder_trials(study, trial_folders(tmp_path), search())
    assert added == {"complete": 2, "pruned": 1, "fail": 2, "running": 1}
    t = study.trials
    assert [x.number for x in t] == [0, 1, 2, 3, 4, 5]
    assert [x.state.name for x in t] == ["COMPLETE"] * 2 + ["PRUNED", "FAIL", "FAIL", "RUNNING"]
    assert t[0].params == {"optimizer.rho": 0.05, "optimizer": "sam"} and t[0].value == 0.6
    assert t[0].intermediate_values == {1: 0.4, 2: 0.6}
    assert t[1].value == -math.inf and t[1].params["optimizer"] == "asam"  # the worst value
    assert t[2].intermediate_values == {1: 0.2} and t[5].params["optimizer.rho"] == 0.3
    # folders the study holds already are left as they are; without a pruner, no reports
    trial_folder(tmp_path, 6, 0.4, "completed", rows=[(1, 0.5)])
    assert add_folder_trials(study, trial_folders(tmp_path), search(False)) == {"complete": 1}
    assert study.trials[6].value == 0.5 and study.trials[6].intermediate_values == {}


@pytest.mark.parametrize(
    ("folder", "why"),
    [
        ({"rho": 0.9}, "optimizer.rho=0.9 is outside its space FloatDistribution"),
        ({"rho": 0.1, "opt": "gsam"}, "optimizer=gsam is outside its space Categorical"),
        ({"rho": 0.1, "fixed": ["model=mlp", "trainer.epochs=5"]}, "it was run with optimizer"),
    ],
)
def test_a_folder_of_another_search_is_refused_and_nothing_is_added(tmp_path, folder, why):
    trial_folder(tmp_path, 0, 0.05, "completed", rows=[(1, 0.4)])
    trial_folder(tmp_path, 1, status="completed", **folder)
    study = optuna.create_study(direction="maximize")
    with pytest.raises(UserError) as e:
        add_folder_trials(study, trial_folders(tmp_path), search())
    assert f"sweep folder {tmp_path} holds a job of another search: job 1 " in str(e.value)
    assert why in str(e.value) and study.trials == []


SEARCH = [
    "-m",
    "hparams_search=sam_rho_lr",
    "model=mlp",
    "trainer.epochs=1",
    "hydra.sweeper.n_trials=2",
]


def finished_search(sweep):
    """The two completed trial folders of SEARCH, values no sampler would draw again."""
    for n, (rho, lr, acc) in enumerate([(0.0123, 0.0456, 0.3), (0.0789, 0.321, 0.5)]):
        folder = sweep / str(n)
        folder.mkdir(parents=True)
        overrides = [f"optimizer.rho={rho}", f"base_optimizer.lr={lr}", *SEARCH[1:4]]
        summary = {"status": "completed", "val_acc": acc, "test_acc": 0.2, "overrides": overrides}
        write_json(folder / "summary.json", summary)


def test_the_same_command_rebuilds_a_deleted_study_and_trains_nothing_done(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "search"
    finished_search(sweep)
    code, out, err = run_cli([*SEARCH, f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 0, err
    notice = [line for line in err.splitlines() if line.startswith("sam-run: ")]
    assert notice == [
        f"sam-run: no study of the trial folders in {sweep / 'optuna.journal'} (deleted?): "
        "rebuilt study from 2 trial folders (2 completed); the search goes on"
    ]
    assert "trial #0 of" not in out and "trial #1 of" not in out  # nothing asked or trained
    assert "best trial #1 val_acc=0.5000 (maximize) optimizer.rho=0.0789" in out
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert [(t.state.name, t.value) for t in study.trials] == [("COMPLETE", 0.3), ("COMPLETE", 0.5)]
    assert study.trials[1].params == {"optimizer.rho": 0.0789, "base_optimizer.lr": 0.321}


def sweeper(**space):
    """The search sweeper as the command of SEARCH sets it up (no Hydra run: its storage, space
    and fixed settings are all the study's opening reads)."""
    from omegaconf import OmegaConf

    from sam_runner.sweep.search import Search

    s = Search()
    s.config, s.ways, s.way = OmegaConf.create({}), ["maximize"], "maximize"
    s.space, s.fixed, s.keys = space or {"optimizer.rho": RHO, "base_optimizer.lr": RHO}, [], []
    s.fixed, s.keys = list(SEARCH[1:4]), ["val_acc"]
    return s


@pytest.mark.parametrize("name", ["optuna.journal", "optuna.db"])
def test_an_unreadable_study_file_is_moved_aside_in_one_line_and_rebuilt(name, tmp_path, capsys):
    finished_search(tmp_path)
    (tmp_path / name).write_text("garbage\n")
    s = sweeper()
    study = s.create_study(tmp_path, optuna.samplers.RandomSampler(seed=0))
    s.rebuild(study, tmp_path, trial_folders(tmp_path))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"sam-run: {tmp_path / name} cannot be read (")
    assert err.endswith(
        f"moved to {tmp_path / name}.unreadable: rebuilt study from 2 trial folders (2 "
        "completed); the search goes on\n"
    )
    assert (tmp_path / f"{name}.unreadable").read_text().startswith("garbage\n")  # kept
    assert [t.value for t in study.trials] == [0.3, 0.5]
    again = optuna.load_study(study_name="search", storage=open_storage(tmp_path, None))
    assert len(again.trials) == 2  # in the new journal


def test_an_unreadable_journal_and_sqlite_file_are_both_moved_aside_in_one_line(tmp_path, capsys):
    finished_search(tmp_path)
    for name in ("optuna.journal", "optuna.db"):
        (tmp_path / name).write_text("garbage\n")
    s = sweeper()
    study = s.create_study(tmp_path, optuna.samplers.RandomSampler(seed=0))
    s.rebuild(study, tmp_path, trial_folders(tmp_path))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count(" cannot be read (") == 2, err
    assert sorted(p.name for p in tmp_path.glob("*.unreadable")) == [
        "optuna.db.unreadable",
        "optuna.journal.unreadable",
    ]
    assert [t.value for t in study.trials] == [0.3, 0.5]


def test_a_journal_cut_short_gets_the_trials_it_lacks(tmp_path, capsys):
    finished_search(tmp_path)
    s = sweeper()
    study = optuna.create_study(study_name="search", storage=open_storage(tmp_path, None))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    s.rebuild(study, tmp_path, trial_folders(tmp_path))
    assert capsys.readouterr().err == (
        f"sam-run: the study in {tmp_path / 'optuna.journal'} lacked trials #1 on: rebuilt "
        "study from 1 trial folders (1 completed); the search goes on\n"
    )
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]


def test_a_folder_outside_the_space_is_one_line_exit_2(tmp_path, capsys):
    finished_search(tmp_path)
    s = sweeper(**{"optimizer.rho": optuna.distributions.FloatDistribution(0.02, 0.5)})
    study = optuna.create_study(direction="maximize")
    with pytest.raises(SystemExit) as e:
        s.rebuild(study, tmp_path, trial_folders(tmp_path))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and study.trials == []
    assert "holds a job of another search: job 0 cannot be a trial of this one" in err


@pytest.mark.slow
def test_a_real_search_with_its_journal_deleted_goes_on_from_its_folders(tmp_path):
    sweep = tmp_path / "search"
    cmd = [
        sys.executable,
        "-m",
        "sam_runner.cli",
        *SEARCH[:-1],
        "dataset.num_samples=300",
        "dataset.batch_size=64",
        "metrics.hessian.enabled=false",
        "trainer.device=cpu",
        "trainer.progress=none",
        f"dataset.data_dir={tmp_path}",
        f"hydra.sweep.dir={sweep}",
    ]
    first = subprocess.run([*cmd, "hydra.sweeper.n_trials=2"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    before = {n: (sweep / n / "metrics.jsonl").read_bytes() for n in ("0", "1")}
    (sweep / "optuna.journal").unlink()
    again = subprocess.run([*cmd, "hydra.sweeper.n_trials=3"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "rebuilt study from 2 trial folders (2 completed)" in again.stderr
    assert "trial #0 of" not in again.stdout and "trial #1 of" not in again.stdout
    assert "trial #2 of 3: " in again.stdout  # only the trial left runs
    assert {n: (sweep / n / "metrics.jsonl").read_bytes() for n in ("0", "1")} == before
    study = optuna.load_study(study_name="search", storage=open_storage(sweep, None))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for t in study.trials:
        summary = json.loads((sweep / str(t.number) / "summary.json").read_text())
        assert t.value == summary["val_acc"]
