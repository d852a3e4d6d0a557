"""The ``trainer`` group's own keys, checked (the other groups check theirs where they are
built; features check theirs in ``parts.FEATURES``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cli_words import PROGRESS, check_format
from ..errors import integer, number, require
from ..lock import ON_LOCKED
from ..losses import per_example
from ..settings import MAX_SEED, plot_format
from .compile import COMPILE_MODES
from .fast_path import validate_fast_path

if TYPE_CHECKING:
    from omegaconf import DictConfig


def validate_seed(seed: object) -> None:
    """``seed``: torch seeds are 64-bit, and runs derive further seeds from it (seed * 100003 +
    epoch)."""
    integer("seed", seed, f"an integer in [0, {MAX_SEED}]", lambda s: 0 <= s <= MAX_SEED)


def validate_trainer(cfg: DictConfig, seed: bool = True) -> None:
    """The trainer's own keys (the other groups check theirs where they are built), and the
    seed (``seed=False``: checked on its own, ``config_checks``)."""
    t = cfg.trainer
    integer("trainer.epochs", t.epochs, "an integer >= 1", lambda e: e >= 1)
    validate_fast_path(t)  # precision and the fast path's switches
    integer("trainer.accumulate", t.accumulate, "an integer >= 1", lambda a: a >= 1)
    for key, accepted in (("progress", PROGRESS), ("on_locked", ON_LOCKED)):
        value = t.get(key, accepted[0])
        require(
            value in accepted, f"trainer.{key}={value!r} is unknown; choose {', '.join(accepted)}"
        )
    mode = t.get("compile_mode", "default")
    require(
        mode in COMPILE_MODES,
        f"trainer.compile_mode={mode!r} is unknown; choose {', '.join(COMPILE_MODES)}",
    )
    check_format(plot_format(cfg))
    bs = cfg.dataset.batch_size
    require(
        not isinstance(bs, int) or bs <= 0 or bs % t.accumulate == 0,
        f"dataset.batch_size={bs} must be divisible by trainer.accumulate={t.accumulate}",
    )
    clip = t.get("gradient_clip")
    require(
        clip is None or (isinstance(clip, (int, float)) and clip > 0),
        f"trainer.gradient_clip={clip} must be null or a number > 0",
    )
    number(
        "trainer.label_smoothing",
        t.get("label_smoothing", 0.0),
        "a number in [0, 1]",
        lambda s: 0 <= s <= 1,
    )
    integer(
        "trainer.eval_every_n_epochs",
        t.get("eval_every_n_epochs", 1),
        "an integer >= 1",
        lambda n: n >= 1,
    )
    if seed:
        validate_seed(cfg.seed)
    number("trainer.progress_every_s", t.get("progress_every_s", 30), "a number >= 0",
           lambda s: s >= 0)  # fmt: skip
    every = t.get("checkpoint_every_n_steps")
    require(
        not every or cfg.dataset.get("sampler", "uniform") != "sgs",
        f"trainer.checkpoint_every_n_steps={every} cannot resume dataset.sampler=sgs within an "
        "epoch (its statistics of the epoch so far are not checkpointed); leave it null",
    )
    for key in ("steps", "eval_every_n_steps", "checkpoint_every_n_steps"):  # null: off
        if t.get(key) is not None:
            integer(f"trainer.{key}", t[key], "an integer >= 1 (or null)", lambda n: n >= 1)
    per_example(t.get("loss", "cross_entropy"), float(t.get("label_smoothing", 0.0)))
