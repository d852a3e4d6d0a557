"""Bench section "costs": what a study's size costs the runner's own commands, each a
subprocess timed by the wall clock (median of ``--repeats``; 1 with ``--quick``), on fake
sweeps of completed job folders copied from one real small job (scripts/fake_sweep.py).

- costs.resume_done_sweep_s_per_job: ``sam-run -m`` again over a sweep of 300 completed jobs,
  over 300 (target ≤ 0.01 s a job).
- costs.eval_skip_s: ``sam-eval`` over 1,000 jobs already measured (target ≤ 3 s).
- costs.report_s_per_job: ``sam-report`` over 1,000 measured jobs, over 1,000 (target ≤ 0.03 s).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fake_sweep import copy_jobs

# the commands as modules of this interpreter (PYTHONPATH=<another checkout> times that one)
SAM_RUN = [sys.executable, "-m", "sam_runner.cli"]
SAM_EVAL = [sys.executable, "-m", "sam_runner.evaluation.cli"]
SAM_REPORT = [sys.executable, "-m", "sam_runner.results.report"]
JOB = [
    "trainer.epochs=1",
    "dataset.num_samples=500",
    "metrics.hessian.num_samples=128",
    "metrics.hessian.max_iter=10",
    "trainer.progress=none",
]
ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))


def _run(*argv) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)


def _wall(argv, repeats) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _run(*argv)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run(args) -> dict:
    repeats = 1 if args.quick else max(1, min(args.repeats, 3))
    root = Path(tempfile.mkdtemp(prefix="bench_costs_"))
    try:
        real = root / "real"
        _run(*SAM_RUN, "-m", *JOB, "seed=0", f"hydra.sweep.dir={real}")
        _run(*SAM_EVAL, str(real))
        done = copy_jobs(real / "0", root / "s300", 300, real / "multirun.yaml")
        resume = [*SAM_RUN, "-m", *JOB, "seed=range(300)", f"hydra.sweep.dir={done}"]
        measured = copy_jobs(real / "0", root / "e1000", 1000, real / "multirun.yaml", True)
        out = root / "report"
        return {
            "costs.resume_done_sweep_s_per_job": _wall(resume, repeats) / 300,
            "costs.eval_skip_s": _wall([*SAM_EVAL, str(measured)], repeats),
            "costs.report_s_per_job": _wall(
                [*SAM_REPORT, str(measured), "--out", str(out)], repeats
            )
            / 1000,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
