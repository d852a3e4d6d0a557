"""Nothing lost, nothing doubled, nothing silent: the job lock, corrupt run files, and bad
inputs that used to end in a traceback or pass in silence."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, compose, run_cli, wait_for

from sam_runner.errors import UserError
from sam_runner.lock import JobLocked, held_by, job_lock
from sam_runner.rundir import RunDir
from sam_runner.train import train

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- the job lock
def test_a_held_job_lock_says_who_holds_it_and_skips_or_fails(tmp_path, capsys):
    with job_lock(tmp_path, "train") as held:
        assert held and held_by(tmp_path, "train") == f"pid {os.getpid()} on {os.uname()[1]}"
        with job_lock(tmp_path, "train", "skip") as second:
            assert second is False
        err = capsys.readouterr().err
        assert err == (
            f"sam-run: {tmp_path} is being worked on by pid {os.getpid()} on {os.uname()[1]} "
            "(train lock .train.lock): skipped\n"
        )
        with pytest.raises(JobLocked, match="being worked on by pid") as refused:
            with job_lock(tmp_path, "train", "fail", option="trainer.on_locked"):
                pass
        assert str(refused.value).endswith(
            "; wait for it to end, or pass trainer.on_locked=skip or wait"
        )
    assert held_by(tmp_path, "train") is None  # released with its holder: nothing stale


def test_a_lock_dies_with_its_process(tmp_path):
    """SIGKILL of the holder releases it: the OS closes the file."""
    code = (
        "import os, signal, sys; from sam_runner.lock import job_lock\n"
        f"with job_lock({str(tmp_path)!r}, 'train'):\n"
        "    print('held', flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert proc.stdout == "held\n" and proc.returncode == -9
    assert (tmp_path / ".train.lock").exists() and held_by(tmp_path, "train") is None


@pytest.mark.slow
def test_two_identical_sweeps_started_together_share_the_work(tmp_path):
    sweep = tmp_path / "sweep"
    argv = [
        sys.executable, "-m", "sam_runner.cli", "-m", "seed=0,1,2,3", "model=mlp",
        "dataset.num_samples=600", "metrics.hessian.enabled=false", "trainer.epochs=2",
        "trainer.device=cpu", "trainer.progress=lines", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode()[-2000:] for o in outs]
    for job in "0123":
        lines = rows(sweep / job)
        assert [(r["epoch"], r["step"]) for r in lines if "test_acc" in r] == [
            (1, lines[0]["step"]),
            (2, 2 * lines[0]["step"]),
        ], job  # every evaluation line exactly once
        assert json.loads((sweep / job / "summary.json").read_text())["status"] == "completed"
    err = b"".join(o[1] for o in outs).decode()
    # each job's two epochs were trained once, by one of the two processes
    assert err.count("epoch 2/2") == 4, err


# ---------------------------------------------------------------------------- signals (#42)
def _sam_run(*argv, env=ENV):
    return subprocess.Popen(
        [sys.executable, "-m", "sam_runner.cli", *argv], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )  # fmt: skip


def test_sigterm_stops_a_run_as_ctrl_c_does_exit_143(tmp_path):
    """What schedulers and `docker stop` send: one line, the checkpoint kept, resumable."""
    run_dir = tmp_path / "run"
    proc = _sam_run("trainer.epochs=40", "model=mlp", "dataset.num_samples=1000",
                    "metrics.hessian.enabled=false", "trainer.progress=none",
                    f"hydra.run.dir={run_dir}")  # fmt: skip
    ckpt = run_dir / "checkpoints" / "last.pt"
    wait_for(ckpt.exists, "the first checkpoint", proc)
    time.sleep(0.3)  # past the instant between the checkpoint's rename and the run noting it
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert re.fullmatch(
        r"sam-run: SIGTERM: interrupted in epoch \d+; the checkpoint holds epoch "
        r"\d+ \(step \d+\); run the same command again to resume\n",
        err,
    ), err
    assert ckpt.exists() and not (run_dir / "summary.json").exists()


def test_ctrl_c_in_the_checks_before_a_sweep_is_one_line_and_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sam_run("-m", "seed=range(0,3000)", f"hydra.sweep.dir={sweep}")
    maps = Path(f"/proc/{proc.pid}/maps")
    # torch loads with the first job's checks (of 3000): the command is in its checks then
    wait_for(lambda: "libtorch" in maps.read_text(), "torch loaded by the checks", proc)
    assert proc.poll() is None and not sweep.exists()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.count("\n") == 1, err
    assert err.startswith("sam-run: interrupted") and not sweep.exists()


@pytest.mark.parametrize("value", ["", "abc"])
def test_an_omp_num_threads_openmp_cannot_read_prints_nothing_above_the_error(value, tmp_path):
    proc = _sam_run("trainer.epochs=0", f"hydra.run.dir={tmp_path / 'run'}",
                    env=dict(os.environ, OMP_NUM_THREADS=value))  # fmt: skip
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err == "sam-run: error: trainer.epochs=0 must be an integer >= 1\n"


@pytest.fixture
def small_disk(tmp_path):
    """A real 300 KiB file system (tmpfs; root can mount one): a checkpoint does not fit."""
    where = tmp_path / "disk"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()})")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_is_one_line_and_the_same_command_runs_once_there_is_space(small_disk,
                                                                               capsys):  # fmt: skip
    run_dir = small_disk / "run"
    argv = ["trainer.epochs=2", "model=mlp", "dataset.num_samples=1000", "trainer.progress=none",
            "metrics.hessian.enabled=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and err == (
        f"sam-run: error: no space left in {run_dir}; free space and rerun the same command\n"
    )
    assert json.loads((run_dir / "summary.json").read_text())["error"] == (
        "no space left on the device"
    )
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_disk)], check=True)
    code, out, err = run_cli(argv, capsys)
    assert code == 0 and out.startswith("completed: "), err


# ---------------------------------------------------------------------------- corrupt files
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, train(compose(*TINY), run_dir, ["x=1"])


def test_a_corrupt_summary_is_named_and_rebuilt_from_the_checkpoint(finished, capsys):
    run_dir, summary = finished
    lines_before = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "summary.json").write_text('{"status": "compl')  # cut by a full disk, say
    assert RunDir(run_dir).missing_reason.startswith("summary.json is corrupt (not JSON")
    rebuilt = train(compose(*TINY), run_dir, ["x=1"])
    assert "summary.json is corrupt (not JSON" in capsys.readouterr().err
    for key in ("status", "test_acc", "test_ece", "test_nll", "lambda_max", "epochs", "step",
                "reliability", "hessian_num_samples"):  # fmt: skip
        assert rebuilt[key] == summary[key] and rebuilt[key] is not None, key
    assert set(rebuilt) - {"train_time_s"} == set(summary) - {"train_time_s"}  # nothing lost
    assert json.loads((run_dir / "summary.json").read_text())["test_acc"] == summary["test_acc"]
    assert (run_dir / "metrics.jsonl").read_text() == lines_before  # nothing trained again


def test_a_corrupt_summary_without_a_checkpoint_fails_with_that_reason(tmp_path):
    (tmp_path / "summary.json").write_text("")
    with pytest.raises(UserError, match="summary.json is corrupt \\(empty\\) and there is no "):
        train(compose(*TINY), tmp_path, [])
    assert "corrupt" in RunDir(tmp_path).missing_reason


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.progress=fancy"], "trainer.progress='fancy' is unknown; choose auto, bar"),
        (["trainer.on_locked=maybe"], "trainer.on_locked='maybe' is unknown; choose skip, wait"),
        (
            ["metrics=full", "metrics.sharpness.num_samples=0"],
            "metrics.sharpness.num_samples=0 must be an integer >= 1",
        ),
        (["seed=99999999999999999999"], "seed=99999999999999999999 must be an integer in [0, "),
        (["seed=-1"], "seed=-1 must be an integer in [0, 4294967295]"),
        (["+foo=1"], "foo is not a key"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_anything_runs(overrides, message, tmp_path, capsys):
    code, _, err = run_cli([*overrides, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and err.startswith(f"sam-run: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
