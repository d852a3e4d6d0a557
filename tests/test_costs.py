"""What a study's size costs: finished jobs recognised from their folders, numbers kept for the
rest, and the CPU thread rule."""

from __future__ import annotations

import json

import pytest
from conftest import compose

from sam_runner import distributed
from sam_runner.errors import UserError
from sam_runner.rundir import job_dirs
from sam_runner.sweep.plan import completed_jobs, numbered_batches
from sam_runner.validate import warnings


def _job(sweep, num, status, overrides):
    d = sweep / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": status, "overrides": overrides}))


def test_completed_jobs_are_those_whose_summary_says_so_for_the_same_job(tmp_path):
    jobs = [[f"seed={n}", "trainer.epochs=1"] for n in range(5)]
    _job(tmp_path, 0, "completed", jobs[0])
    _job(tmp_path, 1, "failed", jobs[1])
    # the same job written otherwise (another order, a how-it-runs key) is the same job
    _job(tmp_path, 2, "completed", ["trainer.epochs=1", "seed=2", "trainer.progress=none"])
    _job(tmp_path, 3, "completed", ["seed=99", "trainer.epochs=1"])  # another sweep's job
    done = completed_jobs(tmp_path, jobs)
    assert sorted(done) == [0, 2] and done[0]["status"] == "completed"
    assert [p.name for p in job_dirs(tmp_path)] == ["0", "1", "2", "3"]


def test_the_jobs_left_launch_under_their_own_numbers():
    assert numbered_batches(6, {}) == [(0, [0, 1, 2, 3, 4, 5])]
    assert numbered_batches(6, {0: {}, 3: {}}) == [(1, [1, 2]), (4, [4, 5])]
    assert numbered_batches(6, {1: {}}, max_batch_size=2) == [(0, [0]), (2, [2, 3]), (4, [4, 5])]
    assert numbered_batches(3, {0: {}, 1: {}, 2: {}}) == []


def test_threads_come_from_the_allowed_cpus_slurm_and_trainer_threads(monkeypatch):
    import os

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert distributed.allowed_cpus() == (cpus, "CPU affinity")
    assert distributed.cpu_threads(1) == cpus and distributed.cpu_threads(cpus + 1) == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert distributed.allowed_cpus() == (1, "SLURM_CPUS_PER_TASK")
    assert distributed.cpu_threads(1, threads=3) == 1  # capped at the allowed CPUs (#42)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert distributed.cpu_threads(1, threads=3) == min(3, cpus)
    with pytest.raises(UserError, match=r"^trainer.threads=0 must be null .* an integer >= 1$"):
        distributed.check_threads(0)


def test_more_threads_than_allowed_cpus_is_a_notice(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    notes = [n for n in warnings(compose("trainer.threads=2")) if "threads" in n]
    assert notes == [
        "trainer.threads=2 x 1 process(es) is more than the 1 CPU(s) allowed "
        "(SLURM_CPUS_PER_TASK): capped at 1 thread(s) per process (threads sharing cores are "
        "slower than fewer)"
    ]
    assert not [n for n in warnings(compose("trainer.threads=1")) if "threads" in n]
