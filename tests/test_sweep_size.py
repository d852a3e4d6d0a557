"""A huge grid (#42: 100,000 jobs sat silent in the checks for hours): refused at once in one
line with its count and how to confirm it, and, confirmed, its checks say how they go."""

from __future__ import annotations

import pytest

from sam_runner.preflight import (
    CHECKS_QUIET_S,
    MAX_JOBS_ENV,
    PROGRESS_FROM,
    checks_counter,
    preflight,
    require_confirmed,
)
from sam_runner.sweep.plan import expand, sweep_size


def refused(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        preflight(["-m", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


def test_a_100000_job_sweep_is_refused_with_its_count_and_the_key_to_confirm(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(MAX_JOBS_ENV, raising=False)
    err = refused(capsys, "seed=range(0,1000)", "optimizer.rho=range(1,101)", "model=mlp")
    assert err.startswith(
        "sam-run: error: this sweep is 100,000 jobs (seed: 1000 values x optimizer.rho: 100 "
        "values), more than the 10,000 a sweep runs unconfirmed: sam-run checks every job "
        "before the first starts, about "
    )
    assert "; confirm with SAM_RUNNER_MAX_JOBS=100000 sam-run ..., or sweep fewer values" in err
    # one key of 100,000 values too (its duplicates check took hours)
    assert "this sweep is 100,000 jobs (seed: 100000 values)" in refused(
        capsys, "seed=range(0,100000)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_confirmation_lets_that_many_jobs_through_and_a_bad_one_is_named(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ["seed=0,1", "model=mlp", "trainer.epochs=1"]
    monkeypatch.setenv(MAX_JOBS_ENV, "1")
    assert "this sweep is 2 jobs (seed: 2 values), more than the 1 a sweep" in refused(
        capsys, *argv
    )
    monkeypatch.setenv(MAX_JOBS_ENV, "2")
    require_confirmed(argv, {}, per_job=1.0)  # as many as confirmed: the checks go on
    monkeypatch.setenv(MAX_JOBS_ENV, "lots")
    assert refused(capsys, *argv) == (
        "sam-run: error: SAM_RUNNER_MAX_JOBS='lots' must be a whole number of jobs >= 1\n"
    )


def test_the_count_is_the_grid_before_repeats_and_follows_hydras_last_override():
    args = ["dataset.batch_size=32,64", "seed=0,1,2", "seed=5", "optimizer.rho=0.1,0.2"]
    assert sweep_size(args, {"model": "mlp,cnn1d"}) == (
        8,
        ["model: 2 values", "dataset.batch_size: 2 values", "optimizer.rho: 2 values"],
    )
    assert len(expand(args, {"model": "mlp,cnn1d"})) == 8


def test_a_sweep_of_many_jobs_says_how_its_checks_go_once_they_take_long(capsys):
    assert checks_counter(PROGRESS_FROM - 1).mode == "none"  # a small sweep checks quietly
    quick = checks_counter(PROGRESS_FROM)
    for _ in range(PROGRESS_FROM):
        quick.update()
    assert capsys.readouterr().err == ""  # checks done within CHECKS_QUIET_S say nothing
    counter = checks_counter(PROGRESS_FROM)
    counter.start -= CHECKS_QUIET_S  # as if the first check had taken that long
    for _ in range(PROGRESS_FROM):
        counter.update()
    counter.close()
    lines = capsys.readouterr().err.splitlines()  # not a terminal here: lines, not a bar
    assert lines[0].startswith(f"sam-run: checking the sweep's jobs: 1/{PROGRESS_FROM} jobs (1%)")
    assert "left" in lines[0] and len(lines) == 11  # the first job, then every tenth
    assert lines[-1].startswith(f"sam-run: checking the sweep's jobs: {PROGRESS_FROM}/")
