"""What every figure shares: a figure without pyplot, the one place figures are written (PNG,
PDF or SVG, atomically), readable log axes, natural ordering of names, and one colour per SAM
variant (the same in every figure and every sweep)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from ..cli_words import check_format
from ..runfiles import atomic_write_bytes, finite

FONT = 10  # points: legends and labels readable at 100% zoom
BASE_COLOR = "black"  # the baseline (optimizer=base) in every figure


def figure(nrows=1, ncols=1, size=(6.0, 4.0), **kwargs):
    """A Figure on the Agg canvas with a grid of axes (always 2-D)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110, layout="constrained")  # titles and labels never overlap
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kwargs)


# fonts as text, not Type 3 glyphs (PDF) or paths (SVG keeps them as paths: it renders alike
# everywhere); no creation date, so the same figure gives the same bytes
SAVE_RC = {"pdf.fonttype": 42, "svg.hashsalt": "sam-runner"}
NO_DATE = {"png": None, "pdf": {"CreationDate": None}, "svg": {"Date": None}}


def save_figure(fig, folder, stem: str, fmt: str = "png") -> Path:
    """Render ``fig`` into ``folder/stem.fmt``, written atomically (a half-written figure never
    lands); every figure of the project is written here."""
    import matplotlib

    path = Path(folder) / f"{stem}.{check_format(fmt)}"
    buf = io.BytesIO()
    with matplotlib.rc_context(SAVE_RC):
        fig.savefig(buf, format=fmt, bbox_inches="tight", metadata=NO_DATE[fmt])
    atomic_write_bytes(path, buf.getvalue())
    return path


def log_scale(ax, which: str, values) -> None:
    """Log scale on the ``which`` ("x"/"y") axis; over less than a decade, a few plain-number
    ticks (log ticks would be unreadable there)."""
    from matplotlib import ticker

    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    pos = [v for v in values if finite(v) and v > 0]
    if pos and max(pos) / min(pos) < 10:
        axis.set_major_locator(ticker.MaxNLocator(5))
    else:
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_minor_locator(ticker.NullLocator())
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))  # 20, not 2×10¹


def natural_key(text: str) -> list:
    """Sort key ordering the numbers inside a name by value (``batch_size=32`` before ``128``).
    re.split with one group alternates text and number, so equal positions compare alike."""
    parts = re.split(r"(\d+(?:\.\d*)?(?:e-?\d+)?)", text)
    return [float(p) if i % 2 else p for i, p in enumerate(parts)]


def variant_color(variant: str):
    """The colour of a SAM variant: fixed by its place among the registered variants, so a
    variant looks the same in every figure of every sweep; ``base`` is black."""
    from ..registry import VARIANTS

    if variant == "base":
        return BASE_COLOR
    names = ["sam", *(n for n in VARIANTS if n not in ("base", "sam"))]  # SAM in blue, then by name
    index = names.index(variant) if variant in names else len(names) + sum(map(ord, variant)) % 8
    return PALETTE[index % len(PALETTE)]


# tab10 without its grey, then tab20's light shades but its grey: distinct colours for the first
# eighteen variants (base is black)
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
)
