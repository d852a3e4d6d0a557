"""``sam-run``: the Hydra entry point around ``train(cfg)``."""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import __version__
from .errors import RunFolderConflict, UserError, first_line, one_line
from .paths import config_dir
from .settings import override_key


def run_name(override_dirname: str) -> str:
    """The run folder name for a set of overrides: readable, filesystem-safe, bounded."""
    if not override_dirname:
        return "default"
    name = override_dirname.replace("/", "_")
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("run_name"):
        OmegaConf.register_new_resolver("run_name", run_name)
    if not OmegaConf.has_resolver("sam_runner_groups"):
        from .help import config_groups

        OmegaConf.register_new_resolver("sam_runner_groups", config_groups)


def run_job(cfg: DictConfig):
    """The task Hydra runs for each job: train, turning user errors into one line.

    In a sweep (-m) a failing job never stops the sweep: its summary.json records the
    failure, and the sweep callback (sam_runner.sweep) exits non-zero at the end.
    """
    from hydra.types import RunMode

    from .sweep.jobs import record_failure, run_parallel

    hc = HydraConfig.get()
    run_dir, overrides = hc.runtime.output_dir, list(hc.overrides.task)
    sweeping = hc.mode == RunMode.MULTIRUN
    try:
        return run_parallel(cfg, run_dir, overrides)
    except UserError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"sam-run: error: {e}", file=sys.stderr)
        # another run's folder stops the sweep, untouched
        if sweeping and not isinstance(e, RunFolderConflict):
            return record_failure(run_dir, overrides, str(e))
        sys.exit(2)
    except Exception as e:
        if not sweeping:
            raise
        import traceback

        traceback.print_exc()  # a bug, not bad input: the whole story, then the sweep goes on
        msg = one_line(e)
        print(f"sam-run: job {hc.job.num} failed: {msg}", file=sys.stderr)
        return record_failure(run_dir, overrides, msg)


register_resolvers()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig):
    return run_job(cfg)


def check_output_folder(argv: list[str]) -> None:
    """Fail in one line, before Hydra tries to create it, when the run/sweep folder can't be
    written.
    """
    multirun = "-m" in argv or "--multirun" in argv
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    folder = next(
        (a[len(key) :] for a in argv if a.startswith(key)), "multirun" if multirun else "outputs"
    )
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir() or not os.access(path, os.W_OK):
        print(
            f"sam-run: error: {key[:-1]}={folder} cannot be created or written ({path} is "
            f"{'not a folder' if not path.is_dir() else 'not writable'}); choose a writable folder",
            file=sys.stderr,
        )
        sys.exit(2)


# ---------------------------------------------------------------------------- overrides
def _unknown_option(e) -> str:
    """``optimizer=foo is unknown; choose one of ...`` from Hydra's MissingConfigException."""
    found = re.search(r"Could not find '([^']+)'", str(e))
    if not found or not e.options:
        return first_line(str(e))
    group, _, value = found.group(1).rpartition("/")
    near = difflib.get_close_matches(value, e.options, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"{group}={value} is unknown{hint}; choose one of {', '.join(e.options)}"


def _unknown_key(key: str, job: list[str]) -> str:
    """``trainer.epoch is not a key; did you mean trainer.epochs?``: the nearest key where the
    config without this override has one, else the keys it has there."""
    from .sweep.plan import compose

    try:
        cfg = compose([o for o in job if override_key(o) != key])
    except Exception:
        return f"{key} is not a key; `sam-run --cfg job` lists the keys"
    parent, _, leaf = key.rpartition(".")
    tree = node = OmegaConf.to_container(cfg)
    for part in parent.split(".") if parent else []:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):  # the parent is no section either: match the whole key
        paths = [p for p in _paths(tree) if not p.startswith("hydra.") or key.startswith("hydra.")]
        near = difflib.get_close_matches(key, paths, n=1)
        return f"{key} is not a key; " + (
            f"did you mean {near[0]}?" if near else "`sam-run --cfg job` lists the keys"
        )
    keys = [str(k) for k in node if parent or k != "hydra"]
    choice = cfg.hydra.runtime.choices.get(parent)
    where = f" of {parent}={choice}" if choice is not None else ""
    near = difflib.get_close_matches(leaf, keys, n=1)
    if near:
        return f"{key} is not a key{where}; did you mean {parent + '.' if parent else ''}{near[0]}?"
    return f"{key} is not a key{where}; choose one of {', '.join(keys)}"


def _paths(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        out.append(f"{prefix}{k}")
        if isinstance(v, dict):
            out += _paths(v, f"{prefix}{k}.")
    return out


def _jobs(args) -> list[list[str]]:
    """The overrides of each job to compose: one job per distinct choice of config-group options."""
    if not args.multirun:
        return [args.overrides]
    from .sweep.plan import expand, fixed_config, sweeper_params

    fixed = fixed_config(args.overrides)
    groups = set(fixed.hydra.runtime.choices)
    distinct = {}
    for job in expand(args.overrides, sweeper_params(fixed)):
        distinct.setdefault(tuple(o for o in job if override_key(o) in groups), job)
    return list(distinct.values())


def check_overrides(argv: list[str]) -> None:
    """Compose each job (every option of a -m sweep) with Hydra's own compose before Hydra runs,
    so that an unknown option or key is one line with exit 2, not Hydra's report of ~20 lines with
    exit 1. Errors of other kinds are left to Hydra; HYDRA_FULL_ERROR=1 leaves all of them to it."""
    from hydra._internal.utils import get_args_parser
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    from .sweep.plan import compose

    args = get_args_parser().parse_args(argv)
    if (
        os.environ.get("HYDRA_FULL_ERROR") == "1"
        or args.help
        or args.hydra_help
        or args.shell_completion
        or args.config_path
        or args.config_name
        or args.config_dir
        or args.experimental_rerun
    ):
        return
    job, message = args.overrides, None
    try:
        for job in _jobs(args):
            compose(job)
    except OverrideParseException as e:
        message = (
            f"{e.override} is not a valid override ({first_line(e.message)}); see "
            "https://hydra.cc/docs/advanced/override_grammar/basic/"
        )
    except MissingConfigException as e:
        message = _unknown_option(e)
    except ConfigCompositionException as e:
        bad = re.match(r"Could not override '([^']+)'", str(e))
        if not (bad and isinstance(e.__cause__, (ConfigAttributeError, ConfigKeyError))):
            return  # Hydra's own report
        message = _unknown_key(bad.group(1), job)
    except Exception:
        return
    if message:
        print(f"sam-run: error: {message}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in ("--version", "-V"):
        print(f"sam-runner {__version__}")
        return
    if {"-m", "--multirun"} & set(argv) and {"-c", "--cfg"} & set(argv):
        # Hydra refuses -m with --cfg; `sam-run -m experiment=X --cfg job` prints the preset's
        # config
        sys.argv[1:] = argv = [a for a in argv if a not in ("-m", "--multirun")]
    check_overrides(argv)
    check_output_folder(argv)
    try:
        _main()
    except KeyboardInterrupt as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # train() leaves its last checkpoint and metrics resumable (errors.Interrupted says where it
        # was)
        print(
            f"sam-run: {str(e) or 'interrupted'}; run the same command again to resume",
            file=sys.stderr,
        )
        sys.exit(130)


if __name__ == "__main__":
    main()
