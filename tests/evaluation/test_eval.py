"""sam-eval on a real trained sweep: what eval.json holds, λ_max equal to the one training logged
with the same settings, rerun rules, failures recorded, parallel workers, bad input, SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import wait_for
from eval_helpers import (
    ENV,
    EVAL_ARGS,
    JOBS,
    ROOT,
    copy_of,
    fingerprint,
    sam_eval,
    sam_run,
    trained_sweep,
)

from sam_runner.data import build_data
from sam_runner.lock import lock_path
from sam_runner.models import build_model
from sam_runner.rundir import CHECKPOINT, RunDir
from sam_runner.runfiles import Checkpoint


def record(sweep, job) -> dict:
    return json.loads((sweep / job / "eval.json").read_text())


def summary(sweep, job) -> dict:
    return json.loads((sweep / job / "summary.json").read_text())


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A copy of the trained sweep, measured once with the training's own settings; the files
    sam-eval must not touch, as they were before."""
    sweep = copy_of(trained_sweep(), tmp_path_factory.mktemp("eval") / "sweep")
    before = fingerprint(sweep)
    code, out, err = sam_eval(sweep, *EVAL_ARGS, "trainer.progress=lines")
    assert code == 0, err
    return sweep, before, out, err


def test_eval_json_holds_the_gaps_the_ece_family_and_the_measures(evaluated):
    sweep, _, out, err = evaluated
    assert "4 job(s): 4 to measure, 0 already measured" in out
    assert "[4/4]" in err  # a progress line per job
    for job in JOBS:
        r = record(sweep, job)
        assert r["status"] == "completed"
        assert r["gen_gap"] == r["train_acc"] - r["test_acc"]
        assert r["gen_gap_loss"] == r["test_loss"] - r["train_loss"]
        for key in ("test_ece", "test_ece_adaptive", "test_mce", "test_brier", "test_nll"):
            assert 0 <= r[key] < 10, key
        # label noise is on: the clean labels too
        assert {"train_acc_clean", "train_loss_clean"} <= set(r)
        assert r["eval_settings"]["metrics.hessian.num_samples"] == 256
        assert r["eval_settings"]["format"] == 1
        s = summary(sweep, job)
        # the same weights, evaluated alike: the same test numbers as the run's last evaluation
        assert r["test_acc"] == s["test_acc"] and r["test_ece"] == pytest.approx(s["test_ece"])
        # the same seeded corrupted copies as the run's final evaluation
        for key in [k for k in s if k.startswith("test_acc_c")] + ["test_ece_c"]:
            assert r[key] == pytest.approx(s[key], abs=1e-6), key


def test_lambda_max_equals_the_one_training_logged_to_the_lanczos_tolerance(evaluated):
    sweep = evaluated[0]
    tol = 1e-3  # metrics.hessian.tol, the same in both
    for job in JOBS:
        measured, logged = record(sweep, job)["lambda_max"], summary(sweep, job)["lambda_max"]
        assert abs(measured - logged) <= 2 * tol * abs(logged), (job, measured, logged)
        assert record(sweep, job)["hessian_bn_mode"] == summary(sweep, job)["hessian_bn_mode"]


@pytest.mark.slow  # CI's time (~10 s)
def test_an_mse_jobs_lambda_max_is_of_the_mse_it_trained_on(tmp_path):
    """trainer.loss=mse: sam-eval measures the Hessian of the job's own loss (the cross-entropy's
    top eigenvalue differs by far on the same weights), as training logged it."""
    run = tmp_path / "run"
    args = ["model=mlp", "model.hidden=[16]", "trainer.loss=mse", "trainer.epochs=1"]
    args += ["dataset.num_samples=600", "metrics.hessian.num_samples=128", "trainer.progress=none"]
    sam_run(*args, f"hydra.run.dir={run}")
    code, _, err = sam_eval(run, "metrics.hessian.num_samples=128")
    assert code == 0, err
    measured = json.loads((run / "eval.json").read_text())["lambda_max"]
    logged = json.loads((run / "summary.json").read_text())["lambda_max"]
    assert abs(measured - logged) <= 2e-3 * abs(logged), (measured, logged)


def test_nothing_but_eval_json_is_touched(evaluated):
    sweep, before, _, _ = evaluated
    assert fingerprint(sweep) == before
    assert not (sweep / ".sam-eval").exists()  # only an array launcher writes there


def test_train_accuracy_is_the_whole_training_set_in_eval_mode(evaluated):
    sweep = evaluated[0]
    job = sweep / "2"
    cfg = RunDir(job).omega_config()
    data = build_data(cfg.dataset, torch.device("cpu"), cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    model.load_state_dict(Checkpoint(job / CHECKPOINT).load()["model"])
    model.eval()
    x, noisy = data.train_tensors
    with torch.no_grad():
        pred = torch.cat([model(x[i : i + 100]).argmax(1) for i in range(0, len(x), 100)])
    r = record(sweep, "2")
    assert len(pred) == data.train_size == 800
    assert r["train_acc"] == pytest.approx(float((pred == noisy).float().mean()), abs=1e-6)
    assert r["train_acc_clean"] == pytest.approx(
        float((pred == data.clean_train_labels).float().mean()), abs=1e-6
    )
    assert (data.clean_train_labels != noisy).float().mean() == pytest.approx(0.2, abs=0.01)


def test_same_settings_skip_other_settings_measure_again(evaluated, tmp_path):
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    stamps = {j: (sweep / j / "eval.json").stat().st_mtime_ns for j in JOBS}
    code, out, _ = sam_eval(sweep, *EVAL_ARGS, "eval.workers=2")  # how it runs is no setting
    assert code == 0 and "0 to measure, 4 already measured with these settings" in out
    assert {j: (sweep / j / "eval.json").stat().st_mtime_ns for j in JOBS} == stamps
    # a checkpoint written after the measurement (the job trained again): measured again
    later = (sweep / "0" / "eval.json").stat().st_mtime_ns + 1_000_000
    os.utime(sweep / "0" / CHECKPOINT, ns=(later, later))
    code, out, _ = sam_eval(sweep, *EVAL_ARGS, "trainer.progress=none")
    assert code == 0 and "1 to measure, 3 already measured with these settings" in out
    code, out, _ = sam_eval(sweep, "metrics.hessian.enabled=false", "trainer.progress=none")
    assert code == 0 and "4 to measure, 0 already measured" in out
    for job in JOBS:
        r = record(sweep, job)
        assert "lambda_max" not in r and r["eval_settings"]["metrics.hessian.enabled"] is False
        assert r["test_acc"] == record(evaluated[0], job)["test_acc"]


def test_a_failing_job_is_recorded_and_the_others_go_on(evaluated, tmp_path):
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    (sweep / "1" / CHECKPOINT).write_bytes(b"not a checkpoint")
    for job in ("1", "3"):
        (sweep / job / "eval.json").unlink()
    code, out, err = sam_eval(sweep, *EVAL_ARGS, "trainer.progress=none")
    assert code == 1
    assert "2 to measure, 2 already measured" in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("sam-eval: error: 1 of 2 job(s) failed: 1 (checkpoint ")
    failed = record(sweep, "1")
    assert failed["status"] == "failed" and "unreadable" in failed["error"]
    assert failed["eval_settings"] == record(sweep, "0")["eval_settings"]
    assert record(sweep, "3")["status"] == "completed"
    # a rerun tries the failed job again (and only it)
    code, out, _ = sam_eval(sweep, *EVAL_ARGS, "trainer.progress=none")
    assert code == 1 and "1 to measure, 3 already measured" in out


def test_a_failed_measurement_keeps_the_good_eval_json_and_a_bad_k_is_refused(evaluated, tmp_path):
    """#42: other settings that fail on a job never replace its completed eval.json; a
    metrics.hessian.k Lanczos cannot reach is refused before any job, nothing written."""
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    before = record(sweep, "1")
    code, _, err = sam_eval(sweep, *EVAL_ARGS, "metrics.hessian.k=1000000")
    assert code == 2 and err.count("\n") == 1 and "metrics.hessian.k=1000000 must be at most" in err
    assert record(sweep, "1") == before
    (sweep / "1" / CHECKPOINT).write_bytes(b"not a checkpoint")
    code, _, err = sam_eval(sweep, *EVAL_ARGS, "metrics.ece_bins=10", "trainer.progress=none")
    assert code == 1 and "eval.json keeps the measurement made before" in err
    assert record(sweep, "1") == before and record(sweep, "0")["eval_settings"] != before[
        "eval_settings"]  # fmt: skip


def test_workers_measure_what_one_process_measures(evaluated, tmp_path):
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    for job in JOBS:
        (sweep / job / "eval.json").unlink()
    code, _, err = sam_eval(sweep, *EVAL_ARGS, "eval.workers=2", "trainer.progress=lines")
    assert code == 0, err
    for job in JOBS:
        a, b = record(sweep, job), record(evaluated[0], job)
        for key in ("train_acc", "test_acc", "gen_gap", "test_acc_c", "test_ece"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert a["lambda_max"] == pytest.approx(b["lambda_max"], rel=2e-3)
    # a worker measures several jobs (its start-up paid once): the job locks name at most two
    # processes for the four jobs, none of them the one-process run's
    pids = {lock_path(sweep / job, "eval").read_text().split()[0] for job in JOBS}
    before = {lock_path(evaluated[0] / job, "eval").read_text().split()[0] for job in JOBS}
    assert len(JOBS) == 4 and 1 <= len(pids) <= 2 and not pids & before


@pytest.mark.parametrize(
    "args, message",
    [
        (["metrics=fulll"], "metrics=fulll is unknown (did you mean full?); choose one of"),
        (
            ["metrics.hessian.kk=2"],
            "metrics.hessian.kk is not a key; did you mean metrics.hessian.k?",
        ),
        (["metrics.hessian.k=0"], "metrics.hessian.k=0 must be an integer >= 1"),
        (["eval.workers=0"], "eval.workers=0 must be an integer >= 1"),
        (["trainer.device=tpu"], "trainer.device='tpu' is unknown; choose auto, cpu, cuda"),
        (
            ["metrics.corruptions.enabled=true", "metrics.corruptions.names=[contrast]"],
            "job 0: metrics.corruptions.names: contrast is not a corruption of dataset=mnist1d",
        ),
        (["hydra/launcher=slurm"], "hydra/launcher=slurm needs SLURM's sbatch on PATH"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    evaluated, tmp_path, monkeypatch, args, message
):
    if "hydra/launcher=slurm" in args:  # a machine without SLURM, even where CI runs one
        dirs = os.environ["PATH"].split(os.pathsep)
        monkeypatch.setenv(
            "PATH", os.pathsep.join(d for d in dirs if not Path(d, "sbatch").exists())
        )
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    for job in JOBS:
        (sweep / job / "eval.json").unlink()
    before = sorted(p for p in sweep.rglob("*"))
    code, out, err = sam_eval(sweep, *args)
    assert code == 2 and out == ""
    assert err.startswith(f"sam-eval: error: {message}") and err.count("\n") == 1, err
    assert sorted(p for p in sweep.rglob("*")) == before


def test_a_folder_without_runs_is_one_line(tmp_path):
    code, _, err = sam_eval(tmp_path / "nothing")
    assert code == 2 and err == (
        f"sam-eval: error: PATH='{tmp_path / 'nothing'}' is not a folder; pass a run folder or a "
        "sweep folder of sam-run\n"
    )
    code, _, err = sam_eval(tmp_path)
    assert code == 2 and "holds no run" in err and err.count("\n") == 1


def test_a_run_folder_is_one_job(evaluated, tmp_path):
    run = copy_of(evaluated[0] / "3", tmp_path / "run")
    (run / "eval.json").unlink()
    code, out, _ = sam_eval(run, *EVAL_ARGS, "metrics.hessian.enabled=false")
    assert code == 0 and "1 job(s): 1 to measure" in out and "  .: completed" in out
    assert record(tmp_path, "run")["status"] == "completed"


@pytest.mark.slow
def test_a_killed_sam_eval_finishes_the_rest_without_redoing_a_job(evaluated, tmp_path):
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    for job in JOBS:
        (sweep / job / "eval.json").unlink()
    cmd = [sys.executable, "-m", "sam_runner.evaluation.cli", str(sweep), *EVAL_ARGS]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    measured = lambda: [j for j in JOBS if (sweep / j / "eval.json").exists()]  # noqa: E731
    wait_for(lambda: measured(), "the first eval.json", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {j: (sweep / j / "eval.json").stat() for j in measured()}
    assert 1 <= len(done) < len(JOBS)
    code, out, err = sam_eval(sweep, *EVAL_ARGS, "trainer.progress=none")
    assert code == 0, err
    assert f"{len(JOBS) - len(done)} to measure, {len(done)} already measured" in out
    for job, stat in done.items():  # not measured again: the very same file
        now = (sweep / job / "eval.json").stat()
        assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert all(record(sweep, j)["status"] == "completed" for j in JOBS)


@pytest.mark.slow
def test_an_array_launcher_runs_one_task_per_job(evaluated, tmp_path):
    """hydra/launcher=submitit_local: the submitit array of hydra/launcher=slurm, as local
    processes (the real-SLURM test is in tests/scale/test_slurm.py)."""
    sweep = copy_of(evaluated[0], tmp_path / "sweep")
    for job in JOBS:
        (sweep / job / "eval.json").unlink()
    code, _, err = sam_eval(
        sweep, *EVAL_ARGS, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"
    )
    assert code == 0, err
    assert "submitted 4 task(s)" in err and (sweep / ".sam-eval" / ".submitit").is_dir()
    for job in JOBS:
        assert record(sweep, job)["test_acc_c"] == pytest.approx(
            record(evaluated[0], job)["test_acc_c"], abs=1e-6
        )


def write_averaged(run, scale: float = 1.0) -> None:
    """checkpoints/averaged.pt in trainer.weight_averaging's format: last.pt's model weights,
    floating-point tensors scaled by ``scale``."""
    model = torch.load(run / CHECKPOINT, map_location="cpu", weights_only=True)["model"]
    model = {k: v * scale if v.is_floating_point() else v for k, v in model.items()}
    averaged = {"model": model, "kind": "swa", "n_averaged": 3, "epoch": 1, "step": 10}
    torch.save(averaged, run / "checkpoints" / "averaged.pt")


def test_averaged_weights_are_measured_into_their_own_file(evaluated, tmp_path):
    run = copy_of(evaluated[0] / "3", tmp_path / "run")
    last = json.loads((run / "eval.json").read_text())
    code, _, err = sam_eval(run, "eval.weights=averaged", *EVAL_ARGS)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "averaged.pt" in err
    assert not (run / "eval_averaged.json").exists()
    write_averaged(run)  # the same weights: the same numbers, in the other file
    code, _, err = sam_eval(
        run, "eval.weights=averaged", *EVAL_ARGS, "metrics.hessian.enabled=false"
    )
    assert code == 0, err
    averaged = json.loads((run / "eval_averaged.json").read_text())
    assert json.loads((run / "eval.json").read_text()) == last
    for key in ("test_acc", "test_loss", "train_acc", "gen_gap"):
        assert averaged[key] == pytest.approx(last[key], rel=1e-5), key
    write_averaged(run, 0.5)  # other weights: measured again, other numbers
    code, _, err = sam_eval(
        run, "eval.weights=averaged", *EVAL_ARGS, "metrics.hessian.enabled=false"
    )
    assert code == 0, err
    again = json.loads((run / "eval_averaged.json").read_text())
    assert again["test_loss"] != pytest.approx(averaged["test_loss"], rel=1e-6)


def test_sam_runs_spellings(evaluated, tmp_path):
    run = copy_of(evaluated[0] / "3", tmp_path / "run")
    code, _, err = sam_eval(run, *EVAL_ARGS, "trainer.device=tpu")
    assert code == 2 and "trainer.device='tpu' is unknown" in err and "eval.device" not in err
    code, out, err = sam_eval(run, *EVAL_ARGS, "trainer.device=cpu", "trainer.progress=none")
    assert code == 0 and "already measured" in out
    code, out, err = sam_eval(run, *EVAL_ARGS, "eval.device=cpu")  # one spelling: sam-run's
    assert code == 2 and "eval.device is not a key" in err
