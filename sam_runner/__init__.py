"""sam-runner: an experiment runner for flatness studies (SAM variants, calibration, sharpness)."""

import os
import sys

__version__ = "0.1.0"

# the console scripts (entry_points.COMMANDS): they install their signal handling first, then
# register the resolvers themselves (importing OmegaConf takes a tenth of a second, and a Ctrl-C
# inside it used to end the interpreter with a traceback)
CONSOLE_SCRIPTS = ("sam-run", "sam-report", "sam-landscape", "sam-sweep-lines", "sam-eval",
                   "sam-index")  # fmt: skip


def register_resolvers() -> None:
    """Resolvers the config tree itself uses (registered on import, or by a console script once
    its signal handling is in place: every process that composes or reads a run's config imports
    the package first)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("sam_runner_sharded"):
        # optimizer.sync_perturbation's default: true under trainer.strategy=fsdp, else false
        OmegaConf.register_new_resolver("sam_runner_sharded", lambda s: str(s) == "fsdp")


def _console_script_main() -> bool:
    """Whether this process is one of the console scripts, importing the package for its entry
    point (not a process it spawned: there the main module is ``__mp_main__``)."""
    main = sys.modules.get("__main__")
    name = os.path.basename(getattr(main, "__file__", None) or "")
    return getattr(main, "__name__", "") == "__main__" and name in CONSOLE_SCRIPTS


if not _console_script_main():
    register_resolvers()
