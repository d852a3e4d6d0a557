"""A sweep's jobs checked once per shape, and per job only where a changed value is read
(sweep/value_checks.py): the same answer as checking every job in full, at a fraction of the
checks."""

from __future__ import annotations

import copy

from omegaconf import DictConfig, OmegaConf

from sam_runner.errors import UserError
from sam_runner.preflight import _check_job, check_jobs
from sam_runner.sweep import hydra_api
from sam_runner.sweep.plan import expand
from sam_runner.sweep.value_checks import ConfigReads, ValueChecks, _Shape


def sweep_args(tmp_path, *overrides):
    return hydra_api.args_parser().parse_args(
        ["-m", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    )


def each_in_full(args):
    """(the first bad job's message or None, the notices): every job checked alone, whole."""
    notes = {}
    for job in expand(args.overrides):
        try:
            message = _check_job(args, job, ValueChecks(), notes)
        except UserError as e:
            message = str(e)
        if message:
            return message, []
    return None, list(notes)


def test_bad_values_late_in_a_shape_are_found_as_a_full_check_finds_them(tmp_path):
    for bad in ("optimizer.rho=0.05,-0.1", "seed=0,1,-1", "trainer.epochs=1,0"):
        shared = [o for o in ("optimizer.rho=0.05", "seed=0,1") if o.split("=")[0] not in bad]
        args = sweep_args(tmp_path, "optimizer=sam,asam", *shared, bad)
        message, _ = check_jobs(args)
        assert message is not None and message == each_in_full(args)[0], bad


def test_notices_of_changed_values_are_those_of_full_checks(tmp_path):
    # fp16 on a CPU: a warning of the config's checks, only for the jobs that set it
    args = sweep_args(tmp_path, "trainer.precision=fp32,fp16", "seed=0,1,2")
    got = check_jobs(args)
    assert got == each_in_full(args) and any("fp16" in n for n in got[1])


def test_each_check_runs_once_per_shape_and_again_only_for_what_it_reads(tmp_path):
    args = sweep_args(tmp_path, "optimizer=sam,asam", "optimizer.rho=0.05,0.1", "seed=range(0,6)")
    checks, notes = ValueChecks(), {}
    jobs = expand(args.overrides)
    assert all(_check_job(args, job, checks, notes) is None for job in jobs)
    assert checks.ran["scheduler"] == 2  # once per variant: it reads neither ρ nor the seed
    assert checks.ran["model_and_optimizer"] == 4  # per variant and ρ
    assert len(jobs) == 24 and checks.ran["seed"] == 12  # per variant and seed, not per ρ
    assert checks.ran["resolve"] == 2  # no interpolation calls a resolver on ρ or the seed


def test_a_job_leaves_its_shapes_config_as_the_first_job_composed_it(tmp_path):
    args = sweep_args(tmp_path, "optimizer.rho=0.05,0.2", "seed=0,7")
    checks, notes = ValueChecks(), {}
    jobs = expand(args.overrides)
    _check_job(args, jobs[0], checks, notes)
    (shape,) = checks._shapes.values()
    before = OmegaConf.to_container(shape.cfg)
    for job in jobs[1:]:
        assert _check_job(args, job, checks, notes) is None
    assert OmegaConf.to_container(shape.cfg) == before


def test_config_reads_records_values_read_and_containers_read_whole():
    cfg = OmegaConf.create({"a": {"b": 1, "c": [1, 2]}, "d": {"e": 2}, "s": 3})
    with ConfigReads(cfg) as reads:
        cfg.a.b, cfg.get("s"), cfg.a.c[1], copy.deepcopy(cfg.d)
        OmegaConf.select(OmegaConf.create({"s": 9}), "s")  # another config: not this one's
    assert reads.keys == {"a.b", "s", "a.c", "d"}
    assert reads.read("d.e") and reads.read("a.c") and not reads.read("a.x")
    assert DictConfig._get_node is not None and "ConfigReads" not in repr(DictConfig._get_node)


def test_a_value_named_in_a_resolver_call_resolves_again():
    cfg = OmegaConf.create({"a": 1, "b": "${a}", "c": {"x": 2}, "d": "${oc.decode:${c.x}}"})
    shape = _Shape(cfg, {"a": 1, "c.x": 2})
    assert not shape.needs_resolving({"a": 5}) and shape.needs_resolving({"c.x": 3})
