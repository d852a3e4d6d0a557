"""The words every command spells as sam-run does, and their checks, in one place::

    trainer.device=auto|cpu|cuda|cuda:N      trainer.progress=auto|bar|lines|none
    hydra/launcher=local|slurm|submitit_local    plots.format=png|pdf|svg

sam-run's validation, sam-eval, sam-landscape and sam-report take these values from here, so a
word a user learns for one command means the same in every other (``command_config`` composes an
analysis command's config with them). Torch- and Hydra-free, on the ground floor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import require

if TYPE_CHECKING:
    from collections.abc import Sequence

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: that GPU
PROGRESS = ("auto", "bar", "lines", "none")  # auto: a bar on a terminal, else lines
LAUNCHERS = ("local", "slurm", "submitit_local")  # conf/hydra/launcher and submitit's local one
FORMATS = ("png", "pdf", "svg")  # PNG to look at, PDF and SVG for papers


def _choose(values) -> str:
    return ", ".join(values[:-1]) + " or " + values[-1]


def check_device(value: object, key: str = "trainer.device") -> str:
    """A device name (``cuda:N`` with N a number); its availability is checked where it is
    used (``distributed.resolve_device``)."""
    v = str(value)
    require(
        v in DEVICES[:-1] or (v.startswith("cuda:") and v[5:].isdigit()),
        f"{key}={value!r} is unknown; choose {_choose(DEVICES)}",
    )
    return v


def check_choice(value: str, key: str, values: Sequence[str]) -> str:
    """``value`` when it is one of ``values``, else a one-line error naming them."""
    require(value in values, f"{key}={value!r} is unknown; choose one of {', '.join(values)}")
    return value


def check_progress(value: str, key: str = "trainer.progress") -> str:
    """``trainer.progress`` (or ``key``): one of the progress modes."""
    return check_choice(value, key, PROGRESS)


def check_format(value: str, key: str = "plots.format") -> str:
    """``plots.format`` (or ``key``): one of the figure formats."""
    return check_choice(value, key, FORMATS)


def say_version(argv: Sequence[str]) -> bool:
    """What every command does first: an ``OMP_NUM_THREADS`` that OpenMP cannot read is dropped
    (OpenMP would print a notice above every line when torch loads, and ignore it: the runner's
    thread line says the threads used); ``--version`` (or ``-V``) as the first word prints
    sam-runner's version (the same line on every command) and returns True."""
    import os
    import re

    omp = os.environ.get("OMP_NUM_THREADS")
    if omp is not None and not re.fullmatch(r"\s*0*[1-9]\d*\s*(,\s*\d+\s*)*", omp):
        del os.environ["OMP_NUM_THREADS"]
    if argv and str(argv[0]) in ("--version", "-V"):
        from . import __version__

        print(f"sam-runner {__version__}")
        return True
    return False
