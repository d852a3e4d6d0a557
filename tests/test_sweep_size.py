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


def _plain(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=False), OmegaConf.is_struct(cfg)


def _counted(monkeypatch, plan):
    """Hydra's compose, counted (each call still Hydra's)."""
    calls, real = [], plan.compose
    monkeypatch.setattr(plan, "compose", lambda job, *a: calls.append(job) or real(job, *a))
    return calls, real


@pytest.mark.slow  # CI's time (~11 s); test_value_checks covers the per-shape checks
def test_a_sweeps_values_are_composed_once_per_set_of_group_choices_as_hydra_composes_them(
    monkeypatch,
):
    """A grid of seeds, ρ, lr, strings, bools and nulls over two variants and a preset with
    Hydra's own overrides between: every job's config Hydra's own, key for key, from one
    composition per set of group choices and other overrides."""
    from sam_runner.sweep import plan

    shapes = [
        ["optimizer={v}", "seed={s}", "optimizer.rho={r}", "trainer.epochs=1", "seed={s}"],
        [
            "experiment=gear_vs_sam_mini",
            "hydra.sweep.dir=multirun/x",
            "seed={s}",
            "hydra.job.config.override_dirname.exclude_keys=[seed]",
            "base_optimizer.lr={r}",
            "plots.format={v}",
        ],
        ["seed={s}", "hydra.job.name=j{n}"],  # a Hydra key's value is part of the shape
    ]
    values = [
        {"v": v, "s": s, "r": r, "n": n}
        for v in ("sam", "gear_sam")
        for n, (s, r) in enumerate((("3", "0.05"), ("0", "0.1"), ("41", "null"), ("'7'", "true")))
    ]
    variants = plan.ValueVariants()
    calls, real = _counted(monkeypatch, plan)
    got = [[variants([o.format(**d) for o in shape]) for d in values] for shape in shapes]
    # the first shape: one per variant; the second: its values are all plain; the third: one
    # per Hydra job name
    assert len(calls) == 2 + 1 + 4
    monkeypatch.setattr(plan, "compose", real)
    for shape, cfgs in zip(shapes, got):
        for d, cfg in zip(values, cfgs):
            assert _plain(cfg) == _plain(real([o.format(**d) for o in shape])), (shape, d)
    assert [c.seed for c in got[0][:4]] == [3, 0, 41, "7"]


def test_a_value_variant_is_a_copy_and_other_overrides_compose_as_hydra_does(monkeypatch):
    """A variant's config is its own (what the checks do to one leaves the next as Hydra's);
    added, removed and forced keys, lists, dicts and groups are composed by Hydra every time."""
    from omegaconf import OmegaConf

    from sam_runner.sweep import plan

    variants = plan.ValueVariants()
    first = variants(["seed=1", "model=mlp"])
    OmegaConf.resolve(first.trainer)  # what the checks do to theirs
    first.trainer.epochs = 99
    second = variants(["seed=2", "model=mlp"])
    assert second.trainer.epochs != 99 and _plain(second) == _plain(
        plan.compose(["seed=2", "model=mlp"])
    )
    calls, _ = _counted(monkeypatch, plan)
    for job in (
        ["++seed=5"],
        ["+trainer.extra=1"],
        ["~logger"],
        ["model=mlp"],
        ["metrics.quantization.bits=[8,4]"],
    ):
        variants(job), variants(job)
    assert len(calls) == 10
