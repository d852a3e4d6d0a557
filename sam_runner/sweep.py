"""Sweeps that never lose or repeat a job.

The rule: a job's folder is ``<hydra.sweep.dir>/<job number>``, and job numbers come
from Hydra's basic sweeper (the Cartesian product of the swept overrides, in order).
Running the same sweep command again with the same ``hydra.sweep.dir`` therefore
finds each job in its old folder, where ``train()`` skips it when its summary.json
says completed, resumes it from checkpoints/last.pt when it was interrupted, and runs
it from the start otherwise.

This module holds the pieces around that rule:

* ``SweepCallback`` (registered in conf/config.yaml ``hydra.callbacks``): before any
  job runs it refuses a sweep folder that holds jobs of a different sweep, and the
  SLURM launcher without ``sbatch``; before a single run, a run folder holding a run
  made with other overrides (before Hydra rewrites its .hydra/); after the last job it
  prints one line per job (number, status, test accuracy, overrides) and exits non-zero
  naming failed jobs.
* ``run_parallel``: one job, in one process or in ``trainer.devices`` processes.
* ``record_failure``: a failed job's summary.json (status ``failed`` + one-line error).
* ``sam-sweep-lines``: a sweep expanded into one line of overrides per job, for
  ``scripts/slurm_array.sbatch`` (line i runs in ``<sweep dir>/<i>``, the same layout).

Our choices (not Hydra's): two overrides lists are "the same job" when they are equal
after dropping the keys in ``hydra.job.config.override_dirname.exclude_keys`` and
``runfiles.RUN_ONLY_KEYS`` (``trainer.device``, ``logger``, ``hydra/launcher``...: how a job
runs, not what it computes); a job that left no folder at all is reported as ``missing``
and counts as failed.
"""
from __future__ import annotations

import argparse
import functools
import shlex
import shutil
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from .errors import RunFolderConflict, UserError, one_line
from .runfiles import RUN_ONLY_KEYS, describe_changes, holds_results, read_json, run_only, write_json

DEFAULT_EXCLUDE = ("trainer.device", "trainer.progress")


# ---------------------------------------------------------------------------- one job
def run_parallel(cfg, run_dir, overrides: list[str]) -> dict:
    """Train one job: joins an outside launcher's group (torchrun, srun), starts
    ``trainer.devices`` processes itself, or trains in this process."""
    from . import distributed
    from .train import train
    if distributed.from_env() is not None:
        topo = distributed.init_from_env(str(cfg.trainer.device))
        try:
            summary = train(cfg, run_dir, overrides)
        except BaseException as e:
            if not topo.is_main and not isinstance(e, INTERRUPTIONS):
                # rank 0 records its own failure; the launcher (srun --kill-on-bad-exit) ends the others, so
                # a failing peer says what happened here: its log, and summary.json unless rank 0 wrote one
                msg = f"process {topo.rank} of {topo.world} failed: {one_line(e)}"
                print(f"sam-run: {msg}", file=sys.stderr, flush=True)
                if not isinstance(e, RunFolderConflict):
                    record_failure(run_dir, overrides, msg)
            raise
        topo.shutdown()  # only on success: after a failure the launcher ends the peers
        return summary
    devices = cfg.trainer.get("devices", 1)
    device = distributed.check_devices(devices, str(cfg.trainer.device))
    done = read_json(Path(run_dir) / "summary.json")
    if devices == 1 or (done and done.get("status") == "completed"):
        return train(cfg, run_dir, overrides)
    try:
        return distributed.launch(train, (cfg, str(run_dir), list(overrides)), devices, device)
    except BaseException as e:
        # the launcher's error is the earliest failure of any process: it replaces what rank 0 wrote
        # (its peer's "Connection reset"); a Ctrl-C or requeue is no failure (the same command resumes),
        # nor is a folder of another run
        if not isinstance(e, (*INTERRUPTIONS, RunFolderConflict)):
            record_failure(run_dir, overrides, str(e).splitlines()[0] if str(e) else type(e).__name__, replace=True)
        raise


# a Ctrl-C, or submitit's requeue (SIGUSR2, then sys.exit): the run resumes from its checkpoint
INTERRUPTIONS = (KeyboardInterrupt, SystemExit)


def record_failure(run_dir, overrides: list[str], message: str, replace: bool = False) -> dict:
    """summary.json with status failed and the one-line error (kept when train() already wrote one,
    unless ``replace``)."""
    path = Path(run_dir) / "summary.json"
    summary = read_json(path)
    if replace or not summary or summary.get("status") != "failed":
        summary = {"status": "failed", "error": message.splitlines()[0] if message else "failed",
                   "overrides": list(overrides)}
        try:
            write_json(path, summary)
        except OSError:
            pass
    return summary


# ---------------------------------------------------------------------------- expansion
@functools.lru_cache(maxsize=None)
def _parser(config_loader=None):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    if config_loader is None:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra._internal.utils import create_config_search_path

        from .paths import config_dir
        config_loader = ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir()))
    return OverridesParser.create(config_loader=config_loader)


def expand(arguments: list[str], sweeper_params=None, config_loader=None) -> list[list[str]]:
    """The jobs of a sweep, in Hydra's basic-sweeper order: one overrides list per job number."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    params = [f"{k}={v}" for k, v in (sweeper_params or {}).items()]
    parsed = _parser(config_loader).parse_overrides(params + list(arguments))
    return BasicSweeper.split_arguments(parsed, None)[0]


def compose(overrides: list[str]):
    """The config of one job, Hydra's part included, composed by Hydra's own compose."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from .paths import config_dir
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides), return_hydra_config=True)


def fixed_config(arguments: list[str]):
    """The composed config of a sweep's overrides that do not sweep."""
    return compose([o.input_line for o in _parser().parse_overrides(arguments) if not o.is_sweep_override()])


def sweeper_params(cfg) -> dict:
    """``hydra.sweeper.params`` of a composed config (an experiment preset may sweep)."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    return dict(OmegaConf.to_container(params, resolve=False)) if params else {}


def _settings(overrides, exclude) -> dict:
    """Overrides as {key: value} without how-to-run keys, in Hydra's normal form
    (``x=false`` and ``x=False`` are the same override)."""
    parsed = _parser().parse_overrides([str(o) for o in overrides])
    exclude = (*exclude, *RUN_ONLY_KEYS)
    return {o.get_key_element(): o.get_value_element_as_str() for o in parsed if not run_only(o.key_or_group, exclude)}


def job_key(overrides, exclude=DEFAULT_EXCLUDE) -> list[str]:
    """What makes two jobs the same job: their overrides without how-to-run keys."""
    return sorted(f"{k}={v}" for k, v in _settings(overrides, exclude).items())


def override_changes(old, new, exclude=DEFAULT_EXCLUDE) -> list[str]:
    """'key old -> new' for each override that differs; '(default)' where one side does not set it."""
    a, b = _settings(old, exclude), _settings(new, exclude)
    keys = [*b, *(k for k in a if k not in b)]
    return [f"{k} {a.get(k, '(default)')} -> {b.get(k, '(default)')}" for k in keys if a.get(k) != b.get(k)]


def saved_overrides(job_dir: Path) -> list[str] | None:
    """The overrides a job folder was made with (.hydra/overrides.yaml, else summary.json)."""
    path = Path(job_dir) / ".hydra" / "overrides.yaml"
    if path.exists():
        try:
            return [str(o) for o in OmegaConf.load(path)]
        except Exception:
            return None
    summary = read_json(Path(job_dir) / "summary.json")
    return summary.get("overrides") if summary else None


def check_folder(sweep_dir, jobs: list[list[str]], exclude=DEFAULT_EXCLUDE) -> None:
    """UserError when a job folder of ``sweep_dir`` was made by a different job at its number."""
    sweep_dir = Path(sweep_dir)
    for num, overrides in enumerate(jobs):
        _check_job(sweep_dir / str(num), overrides, exclude, sweep_dir)


def _check_job(job_dir: Path, overrides, exclude, sweep_dir) -> None:
    old = saved_overrides(job_dir)
    if old is not None and job_key(old, exclude) != job_key(overrides, exclude):
        raise UserError(f"sweep folder {sweep_dir} holds jobs of a different sweep: job {job_dir.name} was run "
                        f"with {' '.join(old) or '(no overrides)'}, this sweep's job {job_dir.name} is "
                        f"{' '.join(overrides) or '(no overrides)'}; use another hydra.sweep.dir")


def check_run_folder(run_dir, overrides, exclude=DEFAULT_EXCLUDE) -> None:
    """RunFolderConflict when ``run_dir`` holds a run that these overrides would continue (resume
    its checkpoint, or take its completed summary as theirs) but that was made with other ones.
    A folder whose run left nothing to continue (it failed on bad input) is free to reuse."""
    run_dir = Path(run_dir)
    old = saved_overrides(run_dir)
    if old is None or not holds_results(run_dir):
        return
    changes = override_changes(old, overrides, exclude)
    if changes:
        raise RunFolderConflict(f"run folder {run_dir} holds a run made with other settings "
                                f"({describe_changes(changes)}); use another folder (hydra.run.dir=...), "
                                f"or delete {run_dir} to start over")


# ---------------------------------------------------------------------------- report
def job_dirs(sweep_dir) -> list[Path]:
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def report(sweep_dir, n_jobs: int | None = None) -> tuple[list[str], list[str]]:
    """One line per job (number, status, test accuracy, overrides), and the failed jobs' descriptions."""
    dirs = {int(p.name): p for p in job_dirs(sweep_dir)}
    numbers = range(n_jobs) if n_jobs is not None else sorted(dirs)
    jobs = []
    for num in numbers:
        d = dirs.get(num, Path(sweep_dir) / str(num))
        summary = read_json(d / "summary.json") or {}
        overrides = summary.get("overrides")
        jobs.append((num, d, summary, saved_overrides(d) if overrides is None else overrides))
    # show what varies between jobs; the overrides every job shares are noise here
    known = [set(j[3]) for j in jobs if j[3]]
    shared = set.intersection(*known) if len(known) > 1 else set()
    lines, failed = [], []
    for num, d, summary, overrides in jobs:
        varying = None if overrides is None else " ".join(o for o in overrides if o not in shared)
        # None: the job left nothing to read its overrides from, which is not "no overrides"
        label = varying or ("overrides unknown" if overrides is None else "defaults")
        status = summary.get("status") or ("missing" if not d.exists() else "incomplete")
        acc = summary.get("test_acc")
        acc = f"{acc:.4f}" if isinstance(acc, (int, float)) else "-"
        line = f"#{num:<3} {status:<10} test_acc={acc:<7} {varying or f'({label})'}"
        if summary.get("error"):
            line += f"  [{summary['error']}]"
        lines.append(line)
        if status not in ("completed", "diverged"):  # a divergence is a result, not a failure
            failed.append(f"#{num} ({status}: {label})")
    return lines, failed


def _fail(message: str, code: int = 2, prog: str = "sam-run"):
    # a callback's exceptions are only warnings to Hydra; SystemExit is not an Exception
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class SweepCallback(Callback):
    """Checks a sweep before it starts and reports it when it ends (see the module docstring)."""

    def __init__(self) -> None:
        self.jobs: list[list[str]] | None = None

    def on_multirun_start(self, config, **kwargs) -> None:
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if launcher.endswith("SlurmLauncher") and shutil.which("sbatch") is None:
            _fail("hydra/launcher=slurm needs SLURM's sbatch on PATH, and it is not; run on a SLURM login node "
                  "or use the local launcher (drop hydra/launcher=slurm)")
        if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith("BasicSweeper"):
            return  # job numbers of other sweepers are not known in advance
        arguments = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        params = OmegaConf.select(config, "hydra.sweeper.params")
        params = OmegaConf.to_container(params, resolve=False) if params else {}
        try:
            self.jobs = expand(arguments, params)
            check_folder(config.hydra.sweep.dir, self.jobs, _exclude(config))
        except UserError as e:
            _fail(str(e))

    def on_run_start(self, config, **kwargs) -> None:
        # before Hydra rewrites <run dir>/.hydra/ with this run's config
        run_dir = Path(str(config.hydra.run.dir))
        overrides = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        try:
            if run_dir.name.isdigit():  # a job of an sbatch array (scripts/slurm_array.sbatch): <sweep dir>/<number>
                _check_job(run_dir, overrides, _exclude(config), run_dir.parent)
            else:
                check_run_folder(run_dir, overrides, _exclude(config))
        except UserError as e:
            _fail(str(e))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = str(config.hydra.sweep.dir)
        lines, failed = report(sweep_dir, len(self.jobs) if self.jobs is not None else None)
        print(f"sweep {sweep_dir}: {len(lines)} job(s), {len(lines) - len(failed)} completed", flush=True)
        for line in lines:
            print("  " + line, flush=True)
        if failed:
            _fail(f"{len(failed)} of {len(lines)} job(s) failed or did not finish: {'; '.join(failed)}", code=1)


def _exclude(config) -> tuple:
    keys = OmegaConf.select(config, "hydra.job.config.override_dirname.exclude_keys")
    return tuple(str(k) for k in keys) if keys is not None else DEFAULT_EXCLUDE


# ---------------------------------------------------------------------------- sam-sweep-lines
PROG = "sam-sweep-lines"


def lines_main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Expand a sweep into one line of overrides per job (job i on line i+1), for "
                    "`sbatch --array=0-$((N-1))%P scripts/slurm_array.sbatch LINES SWEEP_DIR`. "
                    "With --report SWEEP_DIR: print the end-of-sweep report of a sweep folder instead.")
    ap.add_argument("overrides", nargs="*", help="the overrides you would give `sam-run -m` (e.g. seed=0,1,2)")
    ap.add_argument("--report", metavar="SWEEP_DIR", help="report a sweep folder; exit 1 if any job failed or did not finish")
    ap.add_argument("--jobs", type=int, help="with --report: how many jobs the sweep has (missing ones count)")
    args = ap.parse_args(argv)
    try:
        if args.report:
            lines, failed = report(args.report, args.jobs)
            for line in lines:
                print(line)
            if failed:
                _fail(f"{len(failed)} of {len(lines)} job(s) failed or did not finish: {'; '.join(failed)}", 1, PROG)
            return
        jobs = expand(args.overrides, sweeper_params(fixed_config(args.overrides)))
    except UserError as e:
        _fail(str(e), 2, PROG)
    except Exception as e:  # Hydra's grammar and config errors
        _fail(f"cannot expand {' '.join(args.overrides)}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", 2, PROG)
    for job in jobs:
        print(" ".join(shlex.quote(o) for o in job))


if __name__ == "__main__":
    lines_main()
