"""Bench section: planning a huge grid (python scripts/bench.py --only plan), #42's 100,000 jobs
(``seed=range(0,1000) optimizer.rho=range(1,101)``) in a fresh sweep folder.

plan_count_s                 counting its jobs (plan.sweep_size: what sam-run refuses a sweep of
                             more than SAM_RUNNER_MAX_JOBS jobs on), seconds
plan_expand_s                listing them (plan.expand: Hydra's order, repeats left out), seconds
plan_expand_over_count       the two side by side (how much sooner the count answers)
plan_reads_over_listing      finding the finished jobs by reading each job's folder (as sam-run
                             did) over one listing of the sweep folder (plan.completed_jobs now),
                             side by side, medians
plan_compose_one_s           composing one job's config (Hydra), seconds: sam-run composes and
                             checks every job before the first starts
plan_value_variant_s         the config of a job that differs from one already composed only in
                             plain values (seed, ρ: plan.ValueVariants, a copy of that config)
plan_compose_over_value_variant  the two side by side
plan_check_all_h             the 100,000 jobs' configs, hours: one composed, the others its value
                             variants (the checks of each config come on top)
plan_s_per_1000_jobs         sam-run's checks of every job of a sweep of 3,000 (optimizer=sam,asam,
                             gear_sam × 5 ρ × seed=range(0,200); 300 with --quick), composing and
                             checking included (preflight.check_jobs, a fresh sweep folder), wall
                             seconds per 1,000 jobs
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchutil import interleaved_ratio, median_time

from sam_runner.preflight import check_jobs
from sam_runner.rundir import RunDir
from sam_runner.sweep import hydra_api
from sam_runner.sweep.plan import ValueVariants, completed_jobs, compose, expand, sweep_size

ARGS = ["seed=range(0,1000)", "optimizer.rho=range(1,101)", "model=mlp"]


def checks_s_per_1000_jobs(seeds: int) -> float:
    """Wall seconds of checking a 3 variants × 5 ρ × ``seeds`` sweep, per 1,000 jobs."""
    argv = [
        "-m",
        "optimizer=sam,asam,gear_sam",
        "optimizer.rho=0.01,0.02,0.05,0.1,0.2",
        f"seed=range(0,{seeds})",
        f"hydra.sweep.dir={tempfile.mkdtemp(prefix='bench-plan-checks-')}",
    ]
    began = time.perf_counter()
    message, _ = check_jobs(hydra_api.args_parser().parse_args(argv))
    assert message is None, message
    return (time.perf_counter() - began) / (15 * seeds) * 1000


def run(args) -> dict:
    repeats = 1 if args.quick else min(args.repeats, 3)
    jobs = expand(ARGS)
    sweep = Path(tempfile.mkdtemp(prefix="bench-plan-"))

    def read_each():  # what completed_jobs did before: one summary read per job number
        return [n for n in range(len(jobs)) if RunDir(sweep / str(n)).summary]

    compose(jobs[0])
    one = median_time(lambda: compose(jobs[1]), repeats)
    variants = ValueVariants()
    first, other = jobs[0], jobs[1]
    variants(first)
    variant = median_time(lambda: variants(other), repeats)
    return {
        "plan_jobs": len(jobs),
        "plan_count_s": median_time(lambda: sweep_size(ARGS), repeats),
        "plan_expand_s": median_time(lambda: expand(ARGS), repeats, warmup=0),
        "plan_expand_over_count": interleaved_ratio(
            lambda: expand(ARGS), lambda: sweep_size(ARGS), repeats, warmup=0
        ),
        "plan_reads_over_listing": interleaved_ratio(
            read_each, lambda: completed_jobs(sweep, jobs), repeats, warmup=0
        ),
        "plan_compose_one_s": one,
        "plan_value_variant_s": variant,
        "plan_compose_over_value_variant": interleaved_ratio(
            lambda: compose(other), lambda: variants(other), repeats
        ),
        "plan_check_all_h": (one + variant * (len(jobs) - 1)) / 3600,
        "plan_s_per_1000_jobs": checks_s_per_1000_jobs(20 if args.quick else 200),
    }
