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
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchutil import interleaved_ratio, median_time

from sam_runner.rundir import RunDir
from sam_runner.sweep.plan import ValueVariants, completed_jobs, compose, expand, sweep_size

ARGS = ["seed=range(0,1000)", "optimizer.rho=range(1,101)", "model=mlp"]


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
    }
