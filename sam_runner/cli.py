"""``sam-run``: the Hydra entry point around ``train(cfg)``."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .errors import UserError
from .paths import config_dir


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


def run_job(cfg: DictConfig):
    """The task Hydra runs for each job: train, turning user errors into one line.

    In a sweep (-m) a failing job never stops the sweep: its summary.json records the
    failure, and the sweep callback (sam_runner.sweep) exits non-zero at the end.
    """
    from hydra.types import RunMode

    from . import sweep
    hc = HydraConfig.get()
    run_dir, overrides = hc.runtime.output_dir, list(hc.overrides.task)
    sweeping = hc.mode == RunMode.MULTIRUN
    try:
        return sweep.run_parallel(cfg, run_dir, overrides)
    except UserError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"sam-run: error: {e}", file=sys.stderr)
        if sweeping:
            return sweep.record_failure(run_dir, overrides, str(e))
        sys.exit(2)
    except Exception as e:
        if not sweeping:
            raise
        import traceback
        traceback.print_exc()  # a bug, not bad input: the whole story, then the sweep goes on
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"sam-run: job {hc.job.num} failed: {msg}", file=sys.stderr)
        return sweep.record_failure(run_dir, overrides, msg)


register_resolvers()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig):
    return run_job(cfg)


def check_output_folder(argv: list[str]) -> None:
    """Fail in one line, before Hydra tries to create it, when the run/sweep folder can't be written."""
    multirun = "-m" in argv or "--multirun" in argv
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    folder = next((a[len(key):] for a in argv if a.startswith(key)), "multirun" if multirun else "outputs")
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir() or not os.access(path, os.W_OK):
        print(f"sam-run: error: {key[:-1]}={folder} cannot be created or written ({path} is "
              f"{'not a folder' if not path.is_dir() else 'not writable'}); choose a writable folder",
              file=sys.stderr)
        sys.exit(2)


def main() -> None:
    argv = sys.argv[1:]
    if {"-m", "--multirun"} & set(argv) and {"-c", "--cfg"} & set(argv):
        # Hydra refuses -m with --cfg; `sam-run -m experiment=X --cfg job` prints the preset's config
        sys.argv[1:] = argv = [a for a in argv if a not in ("-m", "--multirun")]
    check_output_folder(argv)
    _main()


if __name__ == "__main__":
    main()
