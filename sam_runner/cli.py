"""``sam-run``: the Hydra entry point around ``train(cfg)``."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import interrupts
from .cli_words import say_version
from .errors import RunFolderConflict, UserError, no_space, one_line
from .paths import config_dir
from .preflight import preflight
from .rundir import holds_results


def register_resolvers() -> None:
    """The resolvers sam-run's help template reads (``sam_runner_groups``,
    ``sam_runner_config``), registered once."""
    if not OmegaConf.has_resolver("sam_runner_groups"):
        from .help import config_groups, help_config

        OmegaConf.register_new_resolver("sam_runner_groups", config_groups)
        OmegaConf.register_new_resolver("sam_runner_config", help_config)


def run_job(cfg: DictConfig) -> float | None:
    """The task Hydra runs for each job: train, turning user errors into one line; returns the
    job's objective (``trainer.objective``, the number a search sweeper optimises; None without
    one), the worst value when the job failed or diverged.

    In a sweep (-m) a failing job never stops the sweep: its summary.json records the
    failure, and the sweep callback (sam_runner.sweep) exits non-zero at the end.
    """
    from .sweep.objective import job_value

    run_dir, summary = train_job(cfg)
    try:
        return job_value(cfg, run_dir, summary)
    except UserError as e:  # a misspelt objective: stop here rather than rank every trial last
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"sam-run: error: {e}", file=sys.stderr)
        sys.exit(2)


def train_job(cfg: DictConfig) -> tuple[str, dict]:
    """(the job's run folder, its summary), a failed job's recorded in a sweep."""
    from hydra.types import RunMode

    from .sweep import stages
    from .sweep.jobs import record_failure, run_parallel

    hc = HydraConfig.get()
    run_dir, overrides = hc.runtime.output_dir, list(hc.overrides.task)
    sweeping = hc.mode == RunMode.MULTIRUN
    try:
        # a staged preset's job: its stage:NAME references become the folders they name
        stages.resolve(cfg, overrides, Path(run_dir).parent.parent)
        return run_dir, run_parallel(cfg, run_dir, overrides)
    except UserError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"sam-run: error: {e}", file=sys.stderr)
        # another run's folder stops the sweep, untouched
        if sweeping and not isinstance(e, RunFolderConflict):
            return run_dir, record_failure(run_dir, overrides, str(e))
        _remove_if_new(Path(run_dir))
        sys.exit(2)
    except Exception as e:
        if no_space(e) and os.environ.get("HYDRA_FULL_ERROR") != "1":  # the next job would too
            print(
                f"sam-run: error: no space left in {Path(run_dir).parent if sweeping else run_dir};"
                " free space and rerun the same command",
                file=sys.stderr,
            )
            sys.exit(1)
        if not sweeping:
            raise
        import traceback

        traceback.print_exc()  # a bug, not bad input: the whole story, then the sweep goes on
        msg = one_line(e)
        print(f"sam-run: job {hc.job.num} failed: {msg}", file=sys.stderr)
        return run_dir, record_failure(run_dir, overrides, msg)


register_resolvers()


def _remove_if_new(run_dir: Path) -> None:
    """A single run refused on its input leaves no folder behind: the one this command created
    goes, unless it holds something to continue (a checkpoint)."""
    from . import preflight as pf

    new = pf.created
    inside = new is not None and run_dir.resolve().is_relative_to(new.resolve())
    if inside and not holds_results(run_dir):
        shutil.rmtree(new, ignore_errors=True)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


def first_job_of(argv: list[str]) -> list[str]:
    """``argv`` without ``-m``, its sweep replaced by the overrides of the sweep's first job, so
    that ``--cfg`` prints one job's config; says so on stderr. A search (its jobs are not known
    before it runs) and a command whose sweep does not parse keep their overrides as written."""
    from .sweep import hydra_api
    from .sweep.plan import expand, fixed_config, sweeper_params

    argv = [a for a in argv if a not in ("-m", "--multirun")]
    overrides = hydra_api.args_parser().parse_args(argv).overrides
    try:
        fixed = fixed_config(overrides)
        search = hydra_api.is_search(OmegaConf.select(fixed, "hydra.sweeper._target_", default=""))
        jobs = [] if search else expand(overrides, sweeper_params(fixed))
    except Exception:  # Hydra's own error follows, as for any bad override
        jobs = []
    note = "its overrides as written (a search's trials are not known before it runs)"
    if len(jobs) > 1 or (jobs and jobs[0] != overrides):
        argv = [a for a in argv if a not in overrides] + jobs[0]
        note = f"the first of its {len(jobs)} jobs ({' '.join(jobs[0]) or 'no overrides'})"
    print(f"sam-run: note: -m with --cfg prints the config of {note}", file=sys.stderr)
    return argv


def main() -> None:
    """``sam-run``: train one run, or a sweep with ``-m`` (a staged preset's stages in order);
    quick options print and end."""
    argv = sys.argv[1:]
    if say_version(argv):
        return
    interrupts.catch_signals()  # a scheduler's, docker stop's: as Ctrl-C
    quick = bool(QUICK & set(argv))  # prints and ends: a signal waits for its end
    if quick:
        interrupts.defer_signals()
    try:
        if {"-m", "--multirun"} & set(argv) and {"-c", "--cfg"} & set(argv):
            sys.argv[1:] = argv = first_job_of(argv)  # Hydra refuses -m with --cfg
        from .sweep import staged

        stages = staged.command(argv)  # a preset in stages: one sweep per stage, in order
        if stages is not None:
            staged.run(stages, _sweep)
            return
        try:
            _sweep(argv)
        except SystemExit:  # Hydra ends --help with sys.exit: a signal that came is said
            if not (quick and interrupts.PENDING):
                raise
        interrupts.raise_pending()
    except KeyboardInterrupt as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # train() leaves its last checkpoint and metrics resumable (errors.Interrupted says where it
        # was); --help and --cfg have nothing to resume
        interrupts.stopping()
        said = str(e) or "interrupted"
        then = "" if quick else "; run the same command again to resume"
        print(interrupts.said("sam-run", f"{said}{then}"), file=sys.stderr)
        sys.exit(interrupts.exit_code())  # 128 + the signal's number, as the shell says


# Hydra's flags that print and end (help, config, info): nothing runs
QUICK = {"-h", "--help", "-hh", "--hydra-help", "-c", "--cfg", "-i", "--info", "-p", "--package"}


def _sweep(argv: list[str]) -> None:
    """One command (a run, a sweep, or a stage's sweep): checked, then Hydra's app."""
    sys.argv[1:] = argv = preflight(argv)
    interrupts.raise_pending()
    _main()


if __name__ == "__main__":
    main()
