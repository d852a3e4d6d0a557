"""The words every command spells as sam-run does, and their checks, in one place::

    trainer.device=auto|cpu|cuda|cuda:N      trainer.progress=auto|bar|lines|none
    hydra/launcher=local|slurm|submitit_local    plots.format=png|pdf|svg

sam-run's validation, sam-eval, sam-landscape and sam-report take these values from here, so a
word a user learns for one command means the same in every other (``command_config`` composes an
analysis command's config with them). Torch- and Hydra-free, on the ground floor.
"""

from __future__ import annotations

from .errors import require

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: that GPU
PROGRESS = ("auto", "bar", "lines", "none")  # auto: a bar on a terminal, else lines
LAUNCHERS = ("local", "slurm", "submitit_local")  # conf/hydra/launcher and submitit's local one
FORMATS = ("png", "pdf", "svg")  # PNG to look at, PDF and SVG for papers


def _choose(values) -> str:
    return ", ".join(values[:-1]) + " or " + values[-1]


def check_device(value, key: str = "trainer.device") -> str:
    """A device name (``cuda:N`` with N a number); its availability is checked where it is
    used (``distributed.resolve_device``)."""
    v = str(value)
    require(
        v in DEVICES[:-1] or (v.startswith("cuda:") and v[5:].isdigit()),
        f"{key}={value!r} is unknown; choose {_choose(DEVICES)}",
    )
    return v


def check_choice(value, key: str, values) -> str:
    require(value in values, f"{key}={value!r} is unknown; choose one of {', '.join(values)}")
    return value


def check_progress(value, key: str = "trainer.progress") -> str:
    return check_choice(value, key, PROGRESS)


def check_format(value, key: str = "plots.format") -> str:
    return check_choice(value, key, FORMATS)


def say_version(argv) -> bool:
    """``--version`` (or ``-V``) as a command's first word: print sam-runner's version (every
    command prints the same line as ``sam-run --version``) and True."""
    if argv and str(argv[0]) in ("--version", "-V"):
        from . import __version__

        print(f"sam-runner {__version__}")
        return True
    return False
