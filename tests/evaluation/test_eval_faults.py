"""sam-eval under faults: a read-only job folder, a second sam-eval on the same jobs, SIGKILL
with workers, a bad PATH."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for
from eval_helpers import ENV, EVAL_ARGS, JOBS, ROOT, copy_of, sam_eval, trained_sweep

from sam_runner.lock import job_lock
from sam_runner.runfiles import read_json


@pytest.fixture
def sweep(tmp_path):
    copy = copy_of(trained_sweep(), tmp_path / "sweep")
    for job in JOBS:
        (copy / job / "eval.json").unlink(missing_ok=True)
    return copy


def test_a_job_whose_eval_json_cannot_be_written_fails_alone(sweep):
    (sweep / "1" / "eval.json").mkdir()  # a write that fails even for root
    code, out, err = sam_eval(sweep, *EVAL_ARGS, "metrics.hessian.enabled=false")
    assert code == 1, err
    assert f"{sweep / '1' / 'eval.json'} cannot be written (Is a directory)" in out + err
    assert "Traceback" not in err
    assert [read_json(sweep / j / "eval.json")["status"] for j in "023"] == ["completed"] * 3


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` read-only, for root too (root writes through mode bits: the immutable flag)."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        yield
        os.chmod(folder, 0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root, and this file system has no immutable flag (chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_job_fails_alone_and_the_others_are_measured(sweep):
    with read_only(sweep / "1"):
        code, out, err = sam_eval(sweep, *EVAL_ARGS, "metrics.hessian.enabled=false")
    assert code == 1, err
    assert f"job folder {sweep / '1'} is not writable" in out + err
    assert "Traceback" not in err and not (sweep / "1" / "eval.json").exists()
    assert [read_json(sweep / j / "eval.json")["status"] for j in "023"] == ["completed"] * 3


def test_a_corrupt_eval_json_is_named_and_measured_again(sweep):
    code, _, err = sam_eval(sweep, *EVAL_ARGS, "metrics.hessian.enabled=false")
    assert code == 0, err
    (sweep / "1" / "eval.json").write_text('{"status": "compl')  # a write cut short
    code, out, err = sam_eval(sweep, *EVAL_ARGS, "metrics.hessian.enabled=false")
    assert code == 0, err
    assert "1 to measure, 3 already measured" in out
    assert "  measured again: 1 (its eval.json is corrupt (not JSON: " in out
    assert read_json(sweep / "1" / "eval.json")["status"] == "completed"


def test_a_job_another_sam_eval_measures_is_skipped_with_who(sweep):
    with job_lock(sweep / "2", "eval"):
        code, out, err = sam_eval(sweep, *EVAL_ARGS, "metrics.hessian.enabled=false")
    assert f"sam-eval: {sweep / '2'} is being worked on by pid {os.getpid()}" in err
    assert code == 0, err  # that job is the other sam-eval's to measure: no failure of this one
    assert f"  2: skipped: measured by pid {os.getpid()}" in out
    assert not (sweep / "2" / "eval.json").exists()
    assert all(read_json(sweep / j / "eval.json")["status"] == "completed" for j in "013")


def test_a_bad_path_is_refused_before_anything_is_imported(tmp_path):
    code = (
        "import sys; from sam_runner.evaluation.cli import main; rc = main([sys.argv[1]]); "
        "print('torch' in sys.modules); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("sam-eval: error: PATH=")


def test_a_folder_that_holds_no_run_is_refused_before_hydra_or_torch_load(tmp_path):
    """An existing folder without runs (a mistyped sweep, an empty one) is refused as fast as a
    missing one: before the settings are composed, so neither Hydra nor torch is imported
    (omegaconf is: the package registers the config tree's resolver on import)."""
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    code = (
        "import sys; from sam_runner.evaluation.cli import main; rc = main([sys.argv[1]]); "
        "print(sorted(m for m in ('hydra', 'torch') if m in sys.modules)); "
        "sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "empty")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout.strip() == "[]", proc.stdout
    assert proc.stderr.startswith("sam-eval: error: PATH=") and "holds no run" in proc.stderr


def test_progress_lines_say_what_a_job_measures_before_it_ends(sweep):
    """trainer.progress=lines (a log, nohup): between the header and a job's closing line, one
    line as the job starts each part of its measurement, each measure named."""
    args = [sweep / "0", *EVAL_ARGS, "metrics.trace.enabled=true", "trainer.progress=lines"]
    code, out, err = sam_eval(*args)
    assert code == 0, err
    lines = err.splitlines()
    parts = [line.split(": ", 2)[2] for line in lines if line.startswith("sam-eval: .: ")]
    assert [p.split(" ...")[0] for p in parts] == [
        "the training and test sets",
        "the Hessian's top eigenvalue(s) on 256 training samples",
        "trace (metrics.trace)",
        "corruptions (metrics.corruptions)",
    ]
    assert lines[-1].startswith("[1/1] . completed in ")


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_sigkill_of_sam_eval_with_workers_leaves_no_process(sweep):
    cmd = [sys.executable, "-m", "sam_runner.evaluation.cli", str(sweep), *EVAL_ARGS]
    proc = subprocess.Popen(
        [*cmd, "eval.workers=2"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    locks = lambda: [j for j in JOBS if (sweep / j / ".eval.lock").exists()]  # noqa: E731
    wait_for(lambda: len(locks()) >= 2, "two workers measuring", proc)
    below = descendants(proc.pid)
    assert len(below) >= 3  # the forkserver and its two workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 30
    while any(alive(p) for p in below) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in below if alive(p)]
