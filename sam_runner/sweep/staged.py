"""Running a preset in stages (stages.py plans and resolves; this module runs): the checks of
every stage before the first one runs, then each stage's sweep in order, in this process."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import UserError
from ..preflight import _not_a_run, check_jobs, fail, sweep_folder
from ..settings import override_key
from . import hydra_api, stages
from .plan import fixed_config
from .stages import Stage, declared, plan

if TYPE_CHECKING:
    from collections.abc import Callable


def command(argv: list[str]) -> list[Stage] | None:
    """The stages of a ``sam-run -m`` command whose preset has stages; None
    for any other command (and inside a stage's own sweep). Bad input: one line, exit 2."""
    if stages.current is not None or not any(override_key(a) == "experiment" for a in argv):
        return None
    args = hydra_api.args_parser().parse_args(argv)
    if _not_a_run(args):
        return None
    try:
        cfg = fixed_config(args.overrides)
    except Exception:  # preflight says what is wrong with the command
        return None
    if declared(cfg) is None:
        return None
    if not args.multirun:
        fail(f"{' '.join(args.overrides)}: the preset runs in stages; run it as a sweep (-m)")
    try:
        return plan(args.overrides, sweep_folder(args), cfg)
    except UserError as e:
        fail(str(e))


def check(staged: list[Stage]) -> None:
    """Every stage's jobs checked as a sweep's are (their own keys; a reference's folder only
    when its stage starts), before the first one runs: one line, exit 2."""
    for stage in staged:
        message, _ = check_jobs(hydra_api.args_parser().parse_args(stage.argv))
        if message:
            fail(f"stage {stage.name}: {message}")


def run(staged: list[Stage], run_sweep: Callable[[list[str]], object]) -> None:
    """Each stage's sweep in order (``run_sweep(argv)``: sam-run's own, in this process); stops
    at the first stage that does not end with every job completed (exit 1: run again to resume)."""
    check(staged)
    for i, stage in enumerate(staged, 1):
        folder = stage.argv[-1].split("=", 1)[1]
        print(f"sam-run: stage {stage.name} ({i}/{len(staged)}): {folder}", flush=True)
        stages.current, code = stage.name, 0
        try:
            run_sweep(stage.argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            stages.current = None
        if code:
            left = [s.name for s in staged[i:]]
            later = f"; stages {', '.join(left)} not run" if left else ""
            print(
                f"sam-run: error: stage {stage.name} did not complete every job{later}; fix "
                "it and run the same command again (completed jobs are kept)",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(code)
    print(f"sam-run: {len(staged)} stage(s) completed", flush=True)
