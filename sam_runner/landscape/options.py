"""The options of sam-landscape (the landscape.* keys of conf/landscape.yaml; see cli.py) with
their defaults, and the part of them a result depends on (``settings``: two results with the
same settings are the same)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

SLICE_KEYS = ("directions", "seed", "span", "include_bias_bn", "fit_radius")
PAIR_KEYS = ("alpha_range", "alphas", "curve", "curve_epochs", "seed")
EVAL_KEYS = ("bn", "bn_samples", "train_samples")
# landscape.pairs=NAME: the override keys (besides seed) in which a pair's two jobs may differ,
# and how sam-landscape's first line names the pairs
PAIRINGS = {"seeds": ((), "seed pair(s)"), "optimizers": (("base_optimizer",), "optimizer pair(s)")}


@dataclass
class Options:
    # slices
    slices: str = "both"  # 1d | 2d | both
    directions: str = "random"  # random | hessian
    seed: int = 0
    span: tuple = (-1.0, 1.0)
    points: int = 51
    grid: int = 21
    include_bias_bn: bool = False
    fit_radius: float = 0.1
    # between two runs
    alpha_range: tuple = (-0.25, 1.25)
    alphas: int = 31
    curve: str = "linear"  # linear | bezier
    curve_epochs: int | None = None  # None: the run's trainer.epochs
    # evaluation
    bn: str = "eval"  # eval | recompute
    bn_samples: int = 4096
    train_samples: int | None = None  # None: the run's metrics.hessian.num_samples
    batch_size: int = 4096
    device: str = "auto"
    progress: str = "auto"
    weights: str = "last"  # last | averaged: which weights, and which folder the files go in
    plot_format: str = "png"  # png | pdf | svg: the figures' file format (plots.format)

    def settings(self, keys: Iterable[str], **resolved: Any) -> dict:
        """The options in ``keys`` plus the evaluation's, with ``resolved`` defaults filled in."""
        d = asdict(self)
        out = {k: list(d[k]) if isinstance(d[k], tuple) else d[k] for k in (*keys, *EVAL_KEYS)}
        if self.bn == "eval":
            out["bn_samples"] = None  # no statistics are recomputed
        out.update(resolved)
        return out

    def slice_settings(self, dim: str, **resolved: Any) -> dict:
        """The options of a ``dim`` slice (``1d``: its points; ``2d``: its grid), with
        ``resolved`` defaults filled in."""
        extra = {"points": self.points} if dim == "1d" else {"grid": self.grid}
        return {**self.settings(SLICE_KEYS, **resolved), **extra}

    def slice_options(self) -> dict:
        """The options of a slices call as given (what a sweep's resume compares)."""
        out = self.settings(("slices", *SLICE_KEYS, "points", "grid"))
        if self.slices != "both":  # the other slice's resolution does not matter
            out["grid" if self.slices == "1d" else "points"] = None
        return out

    def pair_settings(self, **resolved: Any) -> dict:
        """The options of a connectivity (the seed and epochs only matter to a curve)."""
        linear = {"seed": None, "curve_epochs": None} if self.curve == "linear" else {}
        return self.settings(PAIR_KEYS, **{**linear, **resolved})
