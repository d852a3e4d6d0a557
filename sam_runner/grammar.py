"""The one grammar of the analysis commands (``sam-eval``, ``sam-landscape``) for how they run:
sam-run's own spellings, as ``key=value`` words after PATH::

    trainer.device=auto|cpu|cuda[:N]    trainer.progress=auto|bar|lines|none
    hydra/launcher=local|slurm|submitit_local    hydra.launcher.KEY=VALUE (the preset's keys)
    plots.format=png|pdf|svg (the figures' file format; sam-report takes it too)

and each command's own options as ``key=value`` words of its own section too: sam-eval's
``metrics.*`` and ``eval.*`` (Hydra overrides of conf/eval.yaml), sam-landscape's
``landscape.*`` (``landscape.points=11``, ``landscape.span=[-1,1]``, ``landscape.to=RUN_B``,
``landscape.weights=averaged``). The earlier spellings (``eval.device=``, ``eval.progress=``;
sam-landscape's flags, ``--points 11``) still work for this release, with a one-line notice
once the input is checked.
"""

from __future__ import annotations

import sys

from .errors import require

RUN_KEYS = ("trainer.device", "trainer.progress", "hydra/launcher", "plots.format")
LAUNCHER_PREFIX = "hydra.launcher."


def is_run_word(word: str) -> bool:
    key = word.split("=", 1)[0]
    return "=" in word and (key in RUN_KEYS or key.startswith(LAUNCHER_PREFIX))


def split_run_words(words) -> tuple[dict, list[str], list[str]]:
    """({trainer.device, trainer.progress, hydra/launcher: value}, the hydra.launcher.KEY=VALUE
    words as KEY=VALUE, the other words)."""
    settings, launcher_options, rest = {}, [], []
    for word in words:
        if not is_run_word(word):
            rest.append(word)
            continue
        key, value = word.split("=", 1)
        if key.startswith(LAUNCHER_PREFIX):
            launcher_options.append(f"{key[len(LAUNCHER_PREFIX) :]}={value}")
        else:
            settings[key] = value
    return settings, launcher_options, rest


def require_known(words, command: str, accepted: str) -> None:
    bad = next((w for w in words if not is_run_word(w)), None)
    require(
        bad is None,
        f"{bad!r} is not a {command} setting; after PATH it takes {accepted}",
    )


def deprecated(command: str, old: str, new: str) -> str:
    return f"{command}: note: {old} is deprecated (it goes in the next release); spell it {new}"


def say_notes(notes) -> None:
    for line in dict.fromkeys(notes):
        print(line, file=sys.stderr, flush=True)
