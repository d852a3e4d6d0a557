"""``measures.png`` (``sam-report``): one scatter per measure of the generalization gap against the
measure, one point per completed job, each variant in its colour (style.variant_color), the
panels in the ranking's order, each titled with its τ and Ψ. A measure whose positive values
span a decade or more is drawn on a log axis."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, figure, fits_canvas, log_scale, variant_color

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
LEGEND_GAP = 0.15  # inches between the grid's right margin and the legend


def plot_measures(table: Any, label: Callable[[str], str]) -> Figure:
    """The grid of a ``results.measure_ranking.Table``; ``label(key)`` names a measure."""
    from matplotlib.lines import Line2D

    rows = table.rows
    ncols = min(NCOLS, len(rows))
    nrows = math.ceil(len(rows) / ncols)
    # a grid fixed in inches rather than constrained layout, whose search over 15 panels of a
    # thousand points each cost a second a report; the canvas holds it all (style.fits_canvas:
    # saved without the tight crop's extra pass over every text)
    m = MARGIN
    grid = m["left"] + ncols * PANEL[0] + (ncols - 1) * m["wgap"] + m["right"]
    height = m["top"] + nrows * PANEL[1] + (nrows - 1) * m["hgap"] + m["bottom"]
    fig, axes = figure(nrows, ncols, size=(grid, height), layout=None, sharey=True)
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
    # beside the grid, past the last tick label; the canvas widened by the legend's own width,
    # and by the title's where it is wider than the grid (a grid of one or two panels)
    legend = fig.legend(
        handles, variants, loc="center left", bbox_to_anchor=(grid + LEGEND_GAP, height / 2),
        bbox_transform=fig.dpi_scale_trans, fontsize=FONT, frameon=False,
    )  # fmt: skip
    title = fig.suptitle(
        f"Generalization gap against each measure ({len(table.points)} completed jobs); "
        "τ: Kendall tau-b, Ψ: granulated",
        fontsize=FONT + 1,
        y=1 - 0.12 / height,
        va="top",
    )
    half_title = title.get_window_extent().width / fig.dpi / 2 + m["right"]
    centre = max(grid / 2, half_title)  # the grid's centre, unless the title would cross 0
    width = grid + LEGEND_GAP + legend.get_window_extent().width / fig.dpi + m["right"]
    width = max(width, centre + half_title)
    fig.set_size_inches(width, height)
    title.set_x(centre / width)
    fig.subplots_adjust(
        left=m["left"] / width,
        right=(grid - m["right"]) / width,
        top=1 - m["top"] / height,
        bottom=m["bottom"] / height,
        wspace=m["wgap"] / PANEL[0],
        hspace=m["hgap"] / PANEL[1],
    )
    return fits_canvas(fig)


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
