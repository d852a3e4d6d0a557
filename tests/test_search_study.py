"""The Optuna side of a search (sweep/study.py): the space from Hydra's override grammar, the
pinned sampler, the journal storage and an older search's SQLite study carried over."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf

from sam_runner.paths import config_dir
from sam_runner.sweep.study import make_sampler, open_storage, parse_space

PRESET = ["optimizer.rho=tag(log, interval(0.01, 0.5))", "base_optimizer.lr=interval(0.01, 0.5)"]


def tpe_preset() -> dict:
    path = Path(config_dir()) / "hydra/sweeper/sampler/tpe.yaml"
    return OmegaConf.to_container(OmegaConf.load(path))


def test_the_presets_space_syntax_becomes_optuna_distributions():
    d = optuna.distributions
    space, fixed = parse_space(
        [
            *PRESET,
            "seed=range(0,4)",
            "optimizer=choice(sam,gear_sam)",
            "trainer.epochs=3",
            "optimizer.rho=interval(0.02, 0.2)",
        ]  # the command's line replaces the preset's
    )
    assert space == {
        "optimizer.rho": d.FloatDistribution(0.02, 0.2),
        "base_optimizer.lr": d.FloatDistribution(0.01, 0.5),
        "seed": d.IntDistribution(0, 3),
        "optimizer": d.CategoricalDistribution(["sam", "gear_sam"]),
    }
    assert fixed == ["trainer.epochs=3"]
    assert parse_space(PRESET[:1])[0]["optimizer.rho"].log


def test_the_pinned_tpe_settings_and_the_values_they_draw():
    """Optuna 5 made TPE multivariate with a constant liar by default; the preset keeps the
    univariate TPE written out. If Optuna changes a default or its seeded draws, this fails."""
    conf = tpe_preset()
    assert conf == {
        "name": "tpe",
        "seed": None,
        "n_startup_trials": 10,
        "n_ei_candidates": 24,
        "multivariate": False,
        "group": False,
        "constant_liar": False,
    }
    signature = inspect.signature(optuna.samplers.TPESampler).parameters
    defaults = {k: p.default for k, p in signature.items()}
    assert {k: defaults[k] for k in ("n_startup_trials", "n_ei_candidates", "group")} == {
        "n_startup_trials": 10,
        "n_ei_candidates": 24,
        "group": False,
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=make_sampler(conf, 0)[0], direction="maximize")
    space = parse_space(PRESET[:1])[0]
    for _ in range(12):
        t = study.ask(space)
        study.tell(t, -abs(t.params["optimizer.rho"] - 0.1))
    drawn = [round(t.params["optimizer.rho"], 6) for t in study.trials]
    assert drawn == [
        0.085589,
        0.164091,
        0.1057,
        0.084283,
        0.052454,
        0.125128,
        0.055392,
        0.327413,
        0.433745,
        0.044818,
        0.01287,
        0.024594,
    ]  # 10 startup, then TPE


def test_an_unknown_sampler_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        make_sampler({"name": "grid"}, 0)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert "sampler.name=grid is unknown; choose one of tpe, random, nsgaii" in err


def test_the_study_lives_in_a_journal_and_an_old_sqlite_study_is_carried_over(tmp_path, capsys):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    old = optuna.create_study(
        study_name="search", direction="maximize", storage=f"sqlite:///{tmp_path / 'optuna.db'}"
    )
    old.set_user_attr("search", {"direction": "maximize"})
    old.enqueue_trial({"x": 0.3})
    t = old.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    old.tell(t, 0.5)
    old.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # running when killed

    # the report reads the SQLite file as it is, without writing a journal
    optuna.load_study(study_name="search", storage=open_storage(tmp_path, None, migrate=False))
    assert not (tmp_path / "optuna.journal").exists()

    study = optuna.load_study(study_name="search", storage=open_storage(tmp_path, None))
    assert "was copied into" in capsys.readouterr().err
    assert (tmp_path / "optuna.journal").is_file()
    assert [(s.state.name, s.params, s.value) for s in study.trials][:1] == [
        ("COMPLETE", {"x": 0.3}, 0.5)
    ]
    assert study.trials[1].state.name == "RUNNING" and study.user_attrs["search"]
    again = optuna.load_study(study_name="search", storage=open_storage(tmp_path, None))
    assert len(again.trials) == 2 and capsys.readouterr().err == ""  # copied once
    assert json.loads((tmp_path / "optuna.journal").read_text().splitlines()[0])


@pytest.mark.slow  # three sam-run processes (~30 s each on a shared 2-core machine)
def test_bad_sweeper_settings_are_one_line_before_anything_trains(tmp_path):
    import os
    import subprocess
    import sys

    base = [sys.executable, "-m", "sam_runner.cli", "-m", "hparams_search=sam_rho_lr"]
    base += ["trainer.epochs=1", f"hydra.sweep.dir={tmp_path / 's'}"]
    cases = {
        "hydra.sweeper.n_trials=0": "hydra.sweeper.n_trials=0 must be at least 1",
        "hydra.sweeper.sampler.name=grid": "sampler.name=grid is unknown",
        f"hydra.sweeper.storage=sqlite:///{tmp_path}/no/such/dir/x.db": "cannot be opened",
    }
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for line, said in cases.items():
        out = subprocess.run([*base, line], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 2 and said in out.stderr, (line, out.stderr[-2000:])
        assert out.stderr.strip().count("\n") == 0, out.stderr
        assert not list((tmp_path / "s").glob("*/metrics.jsonl"))  # nothing trained


@pytest.mark.parametrize(
    "preset, keys",
    [
        ("sam_rho_lr", ["optimizer.rho", "base_optimizer.lr"]),
        ("gear_sam", ["optimizer.rho", "base_optimizer.lr", "optimizer.beta"]),
        ("tlc_sam", ["optimizer.rho", "base_optimizer.lr", "optimizer.tau_target"]),
        ("le_sam", ["optimizer.sigma", "optimizer.rho_max", "base_optimizer.lr"]),
    ],
)
def test_the_presets_compose_onto_our_sweeper_unchanged(preset, keys):
    from sam_runner.sweep.hydra_api import compose

    cfg = compose([f"hparams_search={preset}", "hydra.sweeper.n_trials=7"])
    sweeper = OmegaConf.to_container(cfg.hydra.sweeper)
    assert sweeper["_target_"] == "hydra_plugins.sam_runner_sweeper.search.SearchSweeper"
    assert sweeper["n_trials"] == 7 and sweeper["sampler"] == {**tpe_preset(), "seed": 0}
    space, fixed = parse_space([f"{k}={v}" for k, v in sweeper["params"].items()])
    assert list(space) == keys and fixed == []
    assert all(d.log for k, d in space.items() if k != "optimizer.beta")


def test_a_running_trial_is_rerun_only_when_nobody_runs_it(tmp_path):
    """A second sweeper of the same study leaves the first one's running trials alone; a trial
    whose sweeper was killed (and whose job holds no lock) is run again."""
    import os
    import socket
    import subprocess
    import sys

    from sam_runner.lock import job_lock
    from sam_runner.sweep.search import orphaned

    study = optuna.create_study(storage=open_storage(tmp_path, None))
    x = {"x": optuna.distributions.FloatDistribution(0, 1)}
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], text=True, capture_output=True
    ).stdout.strip()
    here = socket.gethostname()
    for owner in (f"{os.getppid()} {here}", f"{dead} {here}", f"{os.getppid()} {here}"):
        study.ask(x).set_user_attr("sweeper", owner)
    with job_lock(tmp_path / "1", "train"):
        assert not orphaned(study.trials[1], tmp_path)  # its job runs
    assert [orphaned(t, tmp_path) for t in study.trials] == [False, True, False]
