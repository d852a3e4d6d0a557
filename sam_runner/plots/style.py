"""What every figure shares: a figure without pyplot, the one place figures are written (PNG,
PDF or SVG, atomically), readable log axes, natural ordering of names, and one colour per SAM
variant (the same in every figure and every sweep)."""

from __future__ import annotations

import functools
import io
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_words import check_format
from ..runfiles import atomic_write_bytes, finite

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FONT = 10  # points: legends and labels readable at 100% zoom
BASE_COLOR = "black"  # the baseline (optimizer=base) in every figure


def figure(
    nrows: int = 1,
    ncols: int = 1,
    size: tuple[float, float] = (6.0, 4.0),
    layout: str | None = "constrained",
    **kwargs: Any,
) -> tuple[Figure, np.ndarray]:
    """A Figure on the Agg canvas with a grid of axes (always 2-D); ``layout=None`` leaves the
    grid to the caller (``fig.subplots_adjust``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110, layout=layout)  # constrained: no title or label overlaps
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kwargs)


# fonts as text, not Type 3 glyphs (PDF) or paths (SVG keeps them as paths: it renders alike
# everywhere); no creation date, so the same figure gives the same bytes
SAVE_RC = {"pdf.fonttype": 42, "svg.hashsalt": "sam-runner"}
NO_DATE = {"png": None, "pdf": {"CreationDate": None}, "svg": {"Date": None}}


def fits_canvas(fig: Figure) -> Figure:
    """``fig``, marked as laid out to hold everything it draws on its canvas (a grid fixed in
    inches): ``save_figure`` then writes the canvas as it is, without the tight crop, which
    lays out every text once more before drawing (a third of a large figure's time)."""
    fig.sam_runner_fits_canvas = True
    return fig


def save_figure(fig: Figure, folder: Path | str, stem: str, fmt: str = "png") -> Path:
    """Render ``fig`` into ``folder/stem.fmt``, written atomically (a half-written figure never
    lands), cropped to what it draws unless it ``fits_canvas``; every figure of the project is
    written here."""
    import matplotlib

    path = Path(folder) / f"{stem}.{check_format(fmt)}"
    buf = io.BytesIO()
    crop = None if getattr(fig, "sam_runner_fits_canvas", False) else "tight"
    with matplotlib.rc_context(SAVE_RC):
        fig.savefig(buf, format=fmt, bbox_inches=crop, metadata=NO_DATE[fmt])
    atomic_write_bytes(path, buf.getvalue())
    return path


def log_scale(ax: Axes, which: str, values: Iterable[float]) -> None:
    """Log scale on the ``which`` ("x"/"y") axis, its ticks at ``log_ticks(values)`` as plain
    numbers (20, not 2×10¹) and the axis reaching the outer ones: every point lies between two
    labelled ticks, so each can be read off."""
    from matplotlib import ticker

    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    ticks = log_ticks(values)
    if ticks:
        axis.set_major_locator(ticker.FixedLocator(ticks))
        low, high = getattr(ax, f"get_{which}lim")()  # what autoscale made room for (bars, bands)
        getattr(ax, f"set_{which}lim")(min(low, ticks[0]), max(high, ticks[-1]))
    axis.set_minor_locator(ticker.NullLocator())
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))


MAX_LOG_TICKS = 9  # more 1-2-5 ticks than this: decades alone (every k-th over many decades)


def log_ticks(values: Iterable[float]) -> list[float]:
    """The ticks of a log axis over ``values`` (those > 0 count), the first at or below the
    lowest value and the last at or above the highest: under a decade a few plain steps
    (40, 45, ... 60), over a few decades 1, 2, 5 per decade, over more the decades."""
    from matplotlib import ticker

    pos = [float(v) for v in values if finite(v) and v > 0]
    if not pos:
        return []
    low, high = min(pos), max(pos)
    if high / low < 10:
        steps = [t for t in ticker.MaxNLocator(5).tick_values(low, high) if t > 0]
        below, above = nice(low, "below"), nice(high, "above")
        steps = [t for t in steps if below < t < above]
        return [*([below] if not steps or steps[0] > low else []), *steps,
                *([above] if not steps or steps[-1] < high else [])]  # fmt: skip
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks = [m * 10.0**k for k in range(first, last + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if nice(low, "below") <= t <= nice(high, "above")]
    if len(ticks) <= MAX_LOG_TICKS:
        return ticks
    stride = math.ceil((last - first + 1) / MAX_LOG_TICKS)
    return [10.0**k for k in range(first, last + stride, stride)]


def nice(value: float, side: str) -> float:
    """The nearest of 1, 2, 5 × 10^k at or below (``side="below"``) or above ``value``."""
    k = math.floor(math.log10(value))
    near = [m * 10.0**e for e in (k - 1, k, k + 1) for m in (1, 2, 5)]
    tol = 1e-9 * value  # 0.3 written as 0.30000000000000004 is still its own tick
    if side == "below":
        return max(t for t in near if t <= value + tol)
    return min(t for t in near if t >= value - tol)


def natural_key(text: str) -> list:
    """Sort key ordering the numbers inside a name by value (``batch_size=32`` before ``128``).
    re.split with one group alternates text and number, so equal positions compare alike."""
    parts = re.split(r"(\d+(?:\.\d*)?(?:e-?\d+)?)", text)
    return [float(p) if i % 2 else p for i, p in enumerate(parts)]


def variant_color(variant: str) -> str:
    """The colour of a SAM variant: fixed by its place among the registered variants, so a
    variant looks the same in every figure of every sweep; ``base`` is black."""
    if variant == "base":
        return BASE_COLOR
    others = (n for n in variant_names() if n not in ("base", "sam"))
    names = ["sam", *others]  # SAM in blue, then by name
    index = names.index(variant) if variant in names else len(names) + sum(map(ord, variant)) % 8
    return PALETTE[index % len(PALETTE)]


@functools.cache
def variant_names() -> tuple[str, ...]:
    """Every registered variant's name, sorted: the stems of ``conf/optimizer/*.yaml`` (one per
    variant, tests/test_registry.py), read without importing the variants (torch)."""
    from ..paths import config_dir

    return tuple(sorted(p.stem for p in (Path(config_dir()) / "optimizer").glob("*.yaml")))


# tab10 without its grey, then tab20's light shades but its grey, then six darker hues
# (navy, teal, gold, maroon, plum, leaf): distinct colours for the first twenty-four variants
# (base is black; the registry has 24 besides it)
PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#393b79",
    "#1b9e77",
    "#e6ab02",
    "#843c39",
    "#7b4173",
    "#66a61e",
)
