"""``sam-eval PATH [overrides]``: measure the completed jobs of a run or sweep folder at their final
weights, into each job's eval.json (see the package docstring and docs/evaluation.md).

Exit status: 0 when every job to measure was measured (or already was, or another sam-eval holds
it: it is named, and measured by that one); 1 when any failed (each
failure is in its eval.json; the others went on), naming them; 2 on bad input (one line, nothing
written); 130 on Ctrl-C (the jobs done so far are kept: the same command finishes the rest).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import interrupts
from ..cli_words import say_version
from ..errors import UserError, check_names
from ..progress import LAMBDA

PROG = "sam-eval"
SHOWN = ("lambda_max", "gen_gap", "test_acc", "test_acc_c")  # on each job's closing line


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line: PATH and its overrides."""
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Measure the completed runs of a run or sweep folder at their final weights "
        "(train/test loss and accuracy, the generalization gaps, ECE, λ_max and the measures the "
        "metrics settings enable, corruptions), into each job's eval.json.",
        epilog="Overrides: the metrics group and keys as in training (metrics=full, "
        "metrics.hessian.k=5, metrics.corruptions.enabled=true), eval.workers=N (local "
        "processes), trainer.device=cpu|cuda|cuda:N, trainer.progress=bar|lines|none (as for "
        "sam-run), "
        "eval.weights=last|averaged (averaged: checkpoints/averaged.pt, into eval_averaged.json), "
        "hydra/launcher=slurm (one SLURM array task per job, hydra.launcher.* as for sam-run).",
    )
    ap.add_argument("path", type=Path, metavar="PATH", help="a run folder or a sweep folder")
    ap.add_argument("overrides", nargs="*", help="overrides of the eval settings (conf/eval.yaml)")
    return ap.parse_args(argv)


def fail(message: str, code: int = 2) -> int:
    """``sam-eval: error: <message>`` on stderr; returns ``code``, the exit status."""
    interrupts.raise_pending()  # a signal a library turned into an error
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """``sam-eval PATH [overrides]``; returns the exit status (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if say_version(argv):
        return 0
    if not argv:  # argparse would name the optional overrides as required too
        return fail("no folder given: sam-eval PATH [KEY=VALUE ...] (a run or sweep folder)")
    args = parse(argv)
    interrupts.catch_signals()
    try:
        from .paths import job_folders

        check_names(args.path)
        job_folders(args.path)  # before Hydra or torch loads: a wrong PATH is refused at once
        return evaluate_folder(args.path, args.overrides)
    except UserError as e:
        return fail(str(e))
    except KeyboardInterrupt:
        interrupts.stopping()
        print(
            interrupts.said(
                PROG,
                "interrupted; the jobs measured so far are kept: run the same command "
                "again to measure the rest",
            ),
            file=sys.stderr,
        )
        return interrupts.exit_code()


def evaluate_folder(path: Path, overrides: list[str]) -> int:
    """Plan, check, measure, report (see the module docstring for the exit status)."""
    from omegaconf import OmegaConf

    from .plan import check_jobs, plan
    from .settings import check_metrics, compose_eval, eval_settings, launcher, plain

    cfg = compose_eval(overrides, path)
    jobs = plan(path, eval_settings(cfg), str(cfg.eval.weights))
    todo = [j for j in jobs if j.state == "measure"]
    if todo:  # torch and the measuring code load only for a job to measure
        check_metrics(cfg)
        check_jobs(jobs, cfg.metrics)
    print(_header(path, jobs), flush=True)
    records = {}
    if todo:
        from .launch import run_jobs

        if launcher(cfg) == "local" and int(cfg.eval.workers) == 1:
            _threads(str(cfg.trainer.device))  # a pool's workers share the CPUs by the same rule
        params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        records = run_jobs(todo, {**plain(cfg), "root": str(path)}, launcher(cfg), params)
    for job in todo:
        print("  " + _line(job.name, records[job.name]), flush=True)
    # a job another sam-eval holds is that one's to measure: not a failure of this one
    failed = [j for j in todo if records[j.name].get("status") not in ("completed", "skipped")]
    if failed:
        names = "; ".join(f"{j.name} ({records[j.name].get('error')})" for j in failed)
        return fail(f"{len(failed)} of {len(todo)} job(s) failed: {names}", 1)
    return 0


def _threads(device: str) -> None:
    """Measuring in this process on a CPU: torch's threads by the runner's rule (the allowed
    CPUs), as training sets them."""
    from .. import distributed

    if distributed.resolve_device(device).type == "cpu":
        distributed.set_cpu_threads(1)


def _header(path: Path, jobs) -> str:
    count = {s: sum(j.state == s for j in jobs) for s in ("measure", "done", "skip")}
    line = (
        f"sam-eval {path}: {len(jobs)} job(s): {count['measure']} to measure, {count['done']} "
        f"already measured with these settings, {count['skip']} not completed"
    )
    for state, said in (("measure", "measured again"), ("skip", "skipped")):
        named = [f"{j.name} ({j.reason})" for j in jobs if j.state == state and j.reason]
        line += f"\n  {said}: " + "; ".join(named) if named else ""
    return line


def _line(name: str, record: dict) -> str:
    if record.get("status") != "completed":
        return f"{name}: {record.get('status')}: {record.get('error')}"
    shown = " ".join(
        f"{k}={record[k]:{LAMBDA if k == 'lambda_max' else '.4g'}}"
        for k in SHOWN
        if isinstance(record.get(k), (int, float))
    )
    return f"{name}: completed {shown}"


def run() -> None:
    """The console script."""
    sys.exit(main())


if __name__ == "__main__":
    run()
