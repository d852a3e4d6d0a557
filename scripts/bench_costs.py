"""Bench section "costs": what a study's size costs the runner's own commands, each a
subprocess timed by the wall clock (median of ``--repeats``; 1 with ``--quick``), on fake
sweeps of completed job folders copied from one real small job (scripts/fake_sweep.py).

- costs.resume_done_sweep_s_per_job: ``sam-run -m`` again over a sweep of 300 completed jobs,
  over 300 (target ≤ 0.01 s a job).
- costs.eval_skip_s: ``sam-eval`` over 1,000 jobs already measured (target ≤ 3 s).
- costs.report_s_per_job: ``sam-report`` over 1,000 measured jobs, over 1,000 (target ≤ 0.03 s).
- report_s_per_1000_jobs: ``sam-report`` over 1,000 jobs whose eval.json carries the measures of
  ``metrics=full`` (the sharpness and complexity keys the report's sections read, each job's
  own seeded values, gen_gap among them), wall seconds (target ≤ 5 s): the median of the
  repeats into one folder, so all but the first keep the figures whose data is unchanged
  (plots/cache.py), as a report run again during a study does;
- costs.report_first_s_per_1000_jobs: the same report into a fresh folder each time (no figure,
  no parsed YAML kept): a study's first report.
"""

from __future__ import annotations

import json
import os
import random
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


MEASURES = (
    "lambda_max",
    "hessian_trace",
    "sharpness_worst",
    "sharpness_avg",
    "fisher_trace_ratio",
    "sharpness_dim",
    "input_grad_norm",
    "param_norm",
    "dist_from_init",
    "path_norm",
    "spectral_norm_product",
)


def with_measures(sweep_dir: Path) -> Path:
    """Each job's eval.json given the measures of ``metrics=full`` and a gen_gap, its own values
    (seeded by the job's number), so that the report's sections have a study to rank."""
    for job in Path(sweep_dir).iterdir():
        if not job.name.isdigit():
            continue
        g = random.Random(int(job.name))
        path = job / "eval.json"
        values = json.loads(path.read_text())
        values.update({k: g.lognormvariate(0, 1) for k in MEASURES})
        values["gen_gap"] = g.uniform(0, 0.2)
        path.write_text(json.dumps(values, indent=2))
    return Path(sweep_dir)


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
        full = with_measures(
            copy_jobs(real / "0", root / "m1000", 1000, real / "multirun.yaml", True)
        )
        return {
            "report_s_per_1000_jobs": _wall(
                [*SAM_REPORT, str(full), "--out", str(root / "r")], repeats
            ),
            "costs.report_first_s_per_1000_jobs": statistics.median(
                _wall([*SAM_REPORT, str(full), "--out", str(root / f"first{i}")], 1)
                for i in range(repeats)
            ),
            "costs.resume_done_sweep_s_per_job": _wall(resume, repeats) / 300,
            "costs.eval_skip_s": _wall([*SAM_EVAL, str(measured)], repeats),
            "costs.report_s_per_job": _wall(
                [*SAM_REPORT, str(measured), "--out", str(out)], repeats
            )
            / 1000,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
