"""The one run-folder reader on every kind of folder the project writes: a Hydra run, a sweep's
job, a folder trained by ``train(cfg, dir)`` without Hydra, and diverged, failed and interrupted
jobs; its answers are the files' (and those sam-report, sam-eval and sam-landscape rely on)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import yaml
from conftest import compose
from results.results_helpers import copy_sweep, shared_sweep

from sam_runner.errors import UserError
from sam_runner.rebuild import load, state_dict
from sam_runner.results.sweep import build_report
from sam_runner.rundir import RunDir

FAST = ["trainer.epochs=1", "dataset.num_samples=400", "metrics=off", "trainer.progress=none"]
FAST += ["model=mlp", "model.hidden=[16]"]


@pytest.fixture(scope="module")
def without_hydra(tmp_path_factory):
    from sam_runner.train import train

    run_dir = tmp_path_factory.mktemp("plain") / "run"
    cfg = compose(*FAST)
    train(cfg, run_dir, list(FAST))
    return run_dir, cfg


def jobs_of(sweep):
    return sorted(p for p in sweep.iterdir() if (p / ".hydra").is_dir())


def test_a_sweep_job_reads_as_its_files_say():
    job = jobs_of(shared_sweep())[0]
    run = RunDir(job)
    assert run.overrides == yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    assert run.config() == yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
    assert run.summary == json.loads((job / "summary.json").read_text())
    assert run.status == "completed" and run.get("optimizer.name") in ("base", "sam")
    assert run.rows() == [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
    assert run.eval() is None and run.landscape() is None and run.pair_summaries() == []


def test_a_folder_trained_without_hydra_has_the_config_its_summary_records(without_hydra):
    run_dir, cfg = without_hydra
    run = RunDir(run_dir)
    assert not (run_dir / ".hydra").exists() and run.hydra_config is None
    assert run.get("model.arch") == "mlp" and run.get("seed") == cfg.seed
    assert run.get("model.hidden") == [16] and run.overrides == FAST
    loaded = load(run, torch.device("cpu"))
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(loaded.model.state_dict()[k].cpu(), v) for k, v in saved.items())
    assert loaded.variant == cfg.optimizer.name and not loaded.model.training


def test_the_config_falls_back_to_the_checkpoint_when_nothing_else_records_it(
    without_hydra, tmp_path
):
    run_dir = shutil.copytree(without_hydra[0], tmp_path / "run")
    (run_dir / "summary.json").unlink()
    run = RunDir(run_dir)
    assert run.status == "missing" and run.get("model.arch") is None  # torch-free readers
    assert run.config()["model"]["arch"] == "mlp"  # the checkpoint's record
    (run_dir / "checkpoints" / "last.pt").unlink()
    assert run.config() == {}
    with pytest.raises(UserError, match="no .hydra/config.yaml and its checkpoint records no"):
        RunDir(run_dir).omega_config()


@pytest.mark.parametrize("status", ["diverged", "failed"])
def test_diverged_and_failed_jobs(tmp_path, status):
    sweep = copy_sweep(tmp_path / "s")
    job = jobs_of(sweep)[1]
    summary = json.loads((job / "summary.json").read_text())
    summary.update(status=status, error=f"it {status}")
    (job / "summary.json").write_text(json.dumps(summary))
    assert RunDir(job).status == status
    report_job = next(j for j in build_report(sweep).jobs if j.path == job)
    assert report_job.status == status and report_job.detail == f"it {status}"


def test_an_interrupted_job_is_missing_with_its_last_logged_epoch(tmp_path):
    sweep = copy_sweep(tmp_path / "s")
    job = jobs_of(sweep)[2]
    (job / "summary.json").unlink()  # killed before the end: lines, no summary
    run = RunDir(job)
    assert run.status == "missing" and run.rows() and run.get("optimizer.name")
    report_job = next(j for j in build_report(sweep).jobs if j.path == job)
    assert report_job.status == "missing" and "last logged epoch 1" in report_job.detail


def test_weights_a_run_does_not_have_are_one_line(without_hydra):
    with pytest.raises(UserError, match="has no averaged weights") as e:
        state_dict(RunDir(without_hydra[0]), "averaged")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="weights='best' is unknown"):
        state_dict(RunDir(without_hydra[0]), "best")


def test_parsed_yaml_is_reused_while_its_file_is_unchanged_and_parsed_again_after(
    tmp_path, monkeypatch
):
    from sam_runner import rundir

    parses = []
    parse = rundir._parse_yaml
    monkeypatch.setattr(rundir, "_parse_yaml", lambda p: parses.append(p.name) or parse(p))
    kept = tmp_path / "report" / "cache.json"
    job = tmp_path / "job"
    (job / ".hydra").mkdir(parents=True)
    config = job / ".hydra" / "config.yaml"
    config.write_text("optimizer:\n  name: sam\n  rho: 0.05\nseed: 0\n")
    odd = tmp_path / "odd.yaml"
    odd.write_text("1: one\nwhen: 2026-12-06\n")  # JSON cannot say these: parsed every time

    def read_both():
        with rundir.parsed_yaml_kept_in(kept):
            return RunDir(job).hydra_config, rundir._read_yaml(odd)

    first = read_both()
    assert first == ({"optimizer": {"name": "sam", "rho": 0.05}, "seed": 0}, parse(odd))
    assert parses == ["config.yaml", "odd.yaml"] and kept.is_file()
    parses.clear()
    assert read_both() == first and parses == ["odd.yaml"]  # config.yaml from the kept JSON

    # the same size and mtime, another file (an atomic rewrite): parsed again
    stat = config.stat()
    new = config.with_name("new.yaml")
    new.write_text(config.read_text().replace("0.05", "0.10"))
    os.replace(new, config)
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    parses.clear()
    assert read_both()[0]["optimizer"]["rho"] == 0.10 and parses == ["config.yaml", "odd.yaml"]
    # edited in place (another size): parsed again; a value read is the caller's to change
    config.write_text("optimizer:\n  name: base\n")
    with rundir.parsed_yaml_kept_in(kept):
        cfg = RunDir(job).hydra_config
        cfg["optimizer"]["name"] = "changed by the caller"
    with rundir.parsed_yaml_kept_in(kept):
        assert RunDir(job).hydra_config == {"optimizer": {"name": "base"}}
    # outside the context nothing is kept; a kept file that is not ours is ignored
    kept.write_text("[not, ours]")
    assert RunDir(job).hydra_config == {"optimizer": {"name": "base"}}
    assert read_both()[0] == {"optimizer": {"name": "base"}}
