"""logger=wandb: real W&B in offline mode, its run files read back with W&B's own protobuf
schema."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY, compose, stopped_early_of
from results.results_helpers import (
    SWEEP_NAME,
    finished_wandb_content,
    shared_sweep,
    wandb_content,
    wandb_run_files,
)

from sam_runner.errors import UserError
from sam_runner.loggers import build_logger
from sam_runner.train import train

WANDB = ["logger=wandb", "logger.mode=offline", "logger.tags=[t1]"]


def metrics_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """One epoch, then the same job resumed to two (with a mid-epoch curvature row per epoch)."""
    run_dir = tmp_path_factory.mktemp("wandb_run")
    extra = [
        "metrics.hessian.every_n_steps=5",
        "metrics.hessian.num_samples=32",
        "metrics.hessian.max_iter=5",
    ]
    first = train(compose(*TINY, *WANDB, *extra, "trainer.epochs=1"), run_dir)
    first_id = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["logger"][
        "run_id"
    ]
    # so the next call resumes from the checkpoint instead of returning
    stopped_early_of(run_dir, 2)
    summary = train(compose(*TINY, *WANDB, *extra, "trainer.epochs=2"), run_dir)
    return run_dir, first, summary, first_id


def test_every_metrics_line_is_in_the_wandb_history(resumed):
    run_dir, _, _, _ = resumed
    history = wandb_content(run_dir)["history"]
    rows = metrics_rows(run_dir)
    assert any("train_loss" not in r for r in rows), "expected mid-epoch curvature rows"
    for i, row in enumerate(rows):
        logged = history[row["step"]]  # W&B step = the optimizer step
        for key, value in row.items():
            if any(r["step"] == row["step"] and key in r for r in rows[i + 1 :]):
                # two lines at one step share a W&B row: the later line's value is the one kept
                continue
            if key == "step":
                continue
            if isinstance(value, dict):  # W&B flattens nested dicts to a/b keys
                assert {k: logged[f"{key}/{k}"] for k in value} == pytest.approx(value)
            elif isinstance(value, float):
                assert logged[key] == pytest.approx(value), key
            else:
                assert logged[key] == value, key
    # both epochs' rows, none lost to a merge of two rows of the same epoch
    assert sorted({h["epoch"] for h in history.values()}) == [1, 2]
    assert len(history) == len({r["step"] for r in rows})


def test_summary_holds_curvature_calibration_and_status(resumed):
    run_dir, _, summary, _ = resumed
    logged = wandb_content(run_dir)["summary"]
    for key in ("test_acc", "test_ece", "test_nll", "lambda_max"):
        assert logged[key] == pytest.approx(summary[key]), key
    assert logged["status"] == "completed"
    assert summary["lambda_max"] is not None


def test_run_info_config_and_files_inside_the_run_folder(resumed):
    run_dir = resumed[0]
    content = wandb_content(run_dir)
    run = content["runs"][-1]
    assert run.job_type == "sam" and run.project == "sam-runner" and list(run.tags) == ["t1"]
    assert run.run_group == ""  # no sweep: no group
    assert content["config"]["optimizer"]["name"] == "sam"
    assert content["config"]["trainer"]["epochs"] == 2
    assert content["exit_codes"][-1] == 0
    assert all(run_dir in f.parents for f in wandb_run_files(run_dir))


def test_a_resumed_job_continues_the_same_wandb_run(resumed):
    run_dir, first, _, first_id = resumed
    files = wandb_run_files(run_dir)
    assert len(files) == 2, files  # one offline file per process, both for the same run id
    assert {f.name for f in files} == {f"run-{first_id}.wandb"}
    assert (
        torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["logger"]["run_id"]
        == first_id
    )
    assert [r.run_id for r in wandb_content(run_dir)["runs"]] == [first_id, first_id]


@pytest.mark.slow  # CI's time (~20 s: a 2-job sweep); the other wandb tests cover the logging
def test_sweep_jobs_are_grouped_by_the_sweep_folder_with_the_variant_as_job_type():
    sweep = shared_sweep()
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        content = wandb_content(job)
        overrides = json.loads((job / "summary.json").read_text())["overrides"]
        variant = next(o.split("=")[1] for o in overrides if o.startswith("optimizer="))
        assert content["runs"][0].run_group == SWEEP_NAME
        assert content["runs"][0].job_type == variant
        assert content["exit_codes"] == [0]


def test_a_failing_run_still_finishes_its_wandb_run(tmp_path):
    (tmp_path / "checkpoints").write_text("not a folder")  # saving the first checkpoint fails
    with pytest.raises(OSError):
        train(compose(*TINY, *WANDB, "trainer.epochs=1", "metrics.hessian.enabled=false"), tmp_path)
    content = finished_wandb_content(tmp_path)
    assert content["exit_codes"] == [1] and not content["preempting"]
    assert content["summary"]["status"] == "failed"
    assert "FileExistsError" in content["summary"]["error"]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_a_diverged_run_is_finished_as_failed_with_its_status(tmp_path):
    summary = train(
        compose(
            *TINY,
            *WANDB,
            "trainer.epochs=1",
            "base_optimizer.lr=1e12",
            "metrics.hessian.enabled=false",
        ),
        tmp_path,
    )
    assert summary["status"] == "diverged"
    content = finished_wandb_content(tmp_path)
    assert content["exit_codes"] == [1]
    assert content["summary"]["status"] == "diverged"


@pytest.mark.parametrize("status", ["interrupted", "preempted"])
def test_an_interrupted_or_requeued_run_is_marked_preempting_not_just_failed(tmp_path, status):
    cfg = compose(*WANDB)
    logger = build_logger(cfg.logger, tmp_path, cfg)
    logger.start()
    logger.log({"epoch": 1, "step": 3, "train_loss": 0.5})
    logger.finish(status)
    content = finished_wandb_content(tmp_path)
    assert content["preempting"] and content["summary"]["status"] == status


def test_online_without_credentials_falls_back_to_offline_with_one_line(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = compose("logger=wandb", "logger.mode=online")
    logger = build_logger(cfg.logger, tmp_path / "run", cfg)
    logger.start()
    logger.log({"epoch": 1, "step": 3, "train_loss": 0.5})
    logger.finish("completed")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no credentials" in err[0] and "offline" in err[0]
    assert finished_wandb_content(tmp_path / "run")["history"][3]["train_loss"] == 0.5


def test_disabled_mode_writes_nothing_and_has_no_run_id(tmp_path):
    cfg = compose("logger=wandb", "logger.mode=disabled")
    logger = build_logger(cfg.logger, tmp_path, cfg)
    logger.start()
    logger.log({"epoch": 1, "step": 1, "train_loss": 0.5})
    logger.finish("completed")
    assert logger.run_id is None
    assert wandb_run_files(tmp_path) == []


@pytest.mark.parametrize(
    "override, message",
    [
        ("logger.mode=onlin", "logger.mode='onlin' is unknown"),
        ("logger.tags=abc", "logger.tags='abc' must be a list"),
    ],
)
def test_bad_logger_settings_are_one_line_errors(tmp_path, override, message):
    cfg = compose("logger=wandb", override)
    with pytest.raises(UserError, match=message) as e:
        build_logger(cfg.logger, tmp_path, cfg)
    assert "\n" not in str(e.value)
    shutil.rmtree(tmp_path, ignore_errors=True)
