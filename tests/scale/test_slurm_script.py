"""scripts/slurm_array.sbatch without a cluster: bash runs it with SLURM's variables set and a
stand-in for sam-run (that sends the time-limit signal) and for scontrol (that records)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_array.sbatch"


def run_task(
    tmp_path, restarts: int, max_requeues: str | None = None
) -> tuple[subprocess.CompletedProcess, str]:
    """Task 0 of array job 77 at its ``restarts``-th restart; its sam-run gets the USR2 that SLURM
    sends before the time limit. Returns the run and what scontrol was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    (bin_dir / "sam-run").write_text("#!/bin/sh\nkill -USR2 $PPID\nsleep 0.5\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    lines = tmp_path / "lines.txt"
    lines.write_text("seed=0\n")
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SLURM_ARRAY_TASK_ID="0",
        SLURM_ARRAY_JOB_ID="77",
        SLURM_RESTART_COUNT=str(restarts),
        SAM_RUN=str(bin_dir / "sam-run"),
    )
    if max_requeues is not None:
        env["SAM_MAX_REQUEUES"] = max_requeues
    out = subprocess.run(
        ["bash", str(SCRIPT), str(lines), str(tmp_path / "sweep")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    log = tmp_path / "scontrol.log"
    return out, log.read_text() if log.exists() else ""


@pytest.mark.parametrize(
    "restarts, max_requeues, requeued",
    [(0, None, True), (2, None, True), (3, None, False), (3, "5", True), (1, "0", False)],
)
def test_time_limit_requeues_stop_after_the_cap(tmp_path, restarts, max_requeues, requeued):
    out, scontrol = run_task(tmp_path, restarts, max_requeues)
    assert out.returncode == 0, out.stderr
    assert (scontrol == "requeue 77_0\n") == requeued, (scontrol, out.stderr)
    if not requeued:
        assert "not requeueing 77_0" in out.stderr and "SAM_MAX_REQUEUES" in out.stderr


def test_a_requeued_task_appends_to_its_log():
    assert "#SBATCH --open-mode=append" in SCRIPT.read_text().splitlines()


def test_the_launcher_preset_makes_srun_end_every_task_when_one_fails(tmp_path):
    """hydra/launcher=slurm: the job's sbatch file exports SLURM_KILL_BAD_EXIT=1 (srun's
    --kill-on-bad-exit=1; the submitit plugin has no srun_args), so a failing task ends its
    peers."""
    slurm = pytest.importorskip("submitit.slurm.slurm")
    from omegaconf import OmegaConf

    from sam_runner.sweep.plan import compose

    launcher = compose(["hydra/launcher=slurm"]).hydra.launcher
    sbatch = slurm._make_sbatch_string(
        command="true",
        folder=str(tmp_path),
        additional_parameters=OmegaConf.to_container(launcher.additional_parameters),
    )
    assert "#SBATCH --export=ALL,SLURM_KILL_BAD_EXIT=1" in sbatch.splitlines()
