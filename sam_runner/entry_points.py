"""The six console scripts (pyproject.toml's ``[project.scripts]``): signals first, the command
after.

Python turns Ctrl-C into a KeyboardInterrupt wherever the process is, also while a command still
imports Hydra, OmegaConf or torch (its first 0.1-0.8 s), before any handling of its own exists:
that used to print a traceback. So each console script is this standard-library-only function:
SIGTERM made to raise the same KeyboardInterrupt (``interrupts``), then the command imported and
run; an interruption that gets past the command's own handling (there was none yet) ends as one
line, exit 130 (143 for SIGTERM).
"""

from __future__ import annotations

import importlib
import sys

from . import interrupts, register_resolvers

COMMANDS = {  # console script -> (module, function returning its exit code)
    "sam-run": ("sam_runner.cli", "main"),
    "sam-report": ("sam_runner.results.report", "main"),
    "sam-landscape": ("sam_runner.landscape.cli", "main"),
    "sam-sweep-lines": ("sam_runner.sweep.lines", "lines_main"),
    "sam-eval": ("sam_runner.evaluation.cli", "main"),
    "sam-index": ("sam_runner.results.index", "main"),
}


def start(prog: str) -> int | None:
    """Run console script ``prog``; its exit code (None: 0)."""
    interrupts.catch_signals()
    module, function = COMMANDS[prog]
    started = False
    try:
        register_resolvers()  # not on import: the package skips it for a console script
        command = getattr(importlib.import_module(module), function)
        interrupts.raise_pending()
        started = True
        return command()
    except KeyboardInterrupt:
        return _interrupted(prog, started)
    except Exception:
        # a library that caught the KeyboardInterrupt and raised its own error: the signal's
        if interrupts.PENDING:
            return _interrupted(prog, started)
        raise


def _interrupted(prog: str, started: bool) -> int:
    interrupts.stopping()
    what = "interrupted" if started else "interrupted while starting; nothing was written"
    print(interrupts.said(prog, what), file=sys.stderr)
    return interrupts.exit_code()


def sam_run() -> int | None:
    """The ``sam-run`` command."""
    return start("sam-run")


def sam_report() -> int | None:
    """The ``sam-report`` command."""
    return start("sam-report")


def sam_landscape() -> int | None:
    """The ``sam-landscape`` command."""
    return start("sam-landscape")


def sam_sweep_lines() -> int | None:
    """The ``sam-sweep-lines`` command."""
    return start("sam-sweep-lines")


def sam_eval() -> int | None:
    """The ``sam-eval`` command."""
    return start("sam-eval")


def sam_index() -> int | None:
    """The ``sam-index`` command."""
    return start("sam-index")
