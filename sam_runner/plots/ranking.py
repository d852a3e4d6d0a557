"""``measures.png`` (``sam-report``): one scatter per measure of the generalization gap against the
measure, one point per completed job, each variant in its colour (style.variant_color), the
panels in the ranking's order, each titled with its τ and Ψ. A measure whose positive values
span a decade or more is drawn on a log axis."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, figure, log_scale, variant_color

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from matplotlib.figure import Figure

NCOLS = 4
PANEL = (2.8, 2.0)  # inches: one panel's axes
# inches around the panels: tick labels and the y label left, the suptitle and a panel's
# two-line title above, its tick labels and x label below; between columns only the gap (the
# y axis is shared) and half of tick labels either side, between rows a title and an x label
MARGIN = {"left": 0.85, "right": 0.15, "top": 0.8, "bottom": 0.55, "wgap": 0.5, "hgap": 0.95}


def plot_measures(table: Any, label: Callable[[str], str]) -> Figure:
    """The grid of a ``results.measure_ranking.Table``; ``label(key)`` names a measure."""
    from matplotlib.lines import Line2D

    rows = table.rows
    ncols = min(NCOLS, len(rows))
    nrows = math.ceil(len(rows) / ncols)
    # a grid fixed in inches rather than constrained layout, whose search over 15 panels of a
    # thousand points each cost a second a report
    m = MARGIN
    width = m["left"] + ncols * PANEL[0] + (ncols - 1) * m["wgap"] + m["right"]
    height = m["top"] + nrows * PANEL[1] + (nrows - 1) * m["hgap"] + m["bottom"]
    fig, axes = figure(nrows, ncols, size=(width, height), layout=None, sharey=True)
    fig.subplots_adjust(
        left=m["left"] / width,
        right=1 - m["right"] / width,
        top=1 - m["top"] / height,
        bottom=m["bottom"] / height,
        wspace=m["wgap"] / PANEL[0],
        hspace=m["hgap"] / PANEL[1],
    )
    variants = sorted({p.variant for p in table.points}, key=lambda v: (v != "base", v))
    for ax, row in zip(axes.flat, rows):
        _panel(ax, table.points, row, label)
    for ax in list(axes.flat)[len(rows) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("gen. gap (train − test acc.)", fontsize=FONT)
    handles = [
        Line2D([], [], marker="o", linestyle="", color=variant_color(v), markeredgecolor="black")
        for v in variants
    ]
    # beside the grid past the last tick label (the saved figure is cropped to its content)
    right = 1 + (0.3 - m["right"]) / width
    fig.legend(
        handles, variants, loc="center left", bbox_to_anchor=(right, 0.5), fontsize=FONT,
        frameon=False,
    )  # fmt: skip
    fig.suptitle(
        f"Generalization gap against each measure ({len(table.points)} completed jobs); "
        "τ: Kendall tau-b, Ψ: granulated",
        fontsize=FONT + 1,
        y=1 - 0.12 / height,
        va="top",
    )
    return fig


def _panel(ax, points, row, label) -> None:
    key = row["measure"]
    by_variant: dict = {}  # one scatter per variant: a sweep of a thousand jobs draws in seconds
    for p in points:
        x, y = p.values.get(key), p.gen_gap
        if finite(x) and finite(y):
            by_variant.setdefault(p.variant, []).append((x, y))
    for variant, xy in by_variant.items():
        ax.scatter(
            [a for a, _ in xy],
            [b for _, b in xy],
            s=22,
            color=variant_color(variant),
            edgecolors="black",
            linewidths=0.3,
            alpha=0.85,
        )
    xs = [p.values[key] for p in points if finite(p.values.get(key))]
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
        log_scale(ax, "x", xs)
    else:  # a few short ticks: panels are narrow
        from matplotlib import ticker

        ax.xaxis.set_major_locator(ticker.MaxNLocator(4))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.4g}"))
    tau, psi = row["tau_gen_gap"], row["psi"]
    stat = lambda v: f"{v:+.2f}" if finite(v) else "—"  # noqa: E731
    ax.set_title(f"{label(key)}\nτ = {stat(tau)}, Ψ = {stat(psi)}", fontsize=FONT)
    ax.set_xlabel(key, fontsize=FONT - 1)
    ax.tick_params(labelsize=FONT - 2)
    ax.grid(alpha=0.3)
