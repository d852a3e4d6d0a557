"""``barriers.png`` (``sam-report``): the mean barrier by base-optimizer pair as heat maps, one
panel per barrier (train loss, test error), the optimizers on both axes in the sweep's order,
each cell annotated with its mean and number of pairs (blank: no pair connected); pairs of jobs
of different seeds (results/barriers.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .style import FONT, figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_barriers(matrix: dict, shown: dict) -> Figure:
    """``matrix``: results.barriers.barrier_matrix's; ``shown``: {barrier key: panel title}."""
    names = matrix["optimizers"]
    k = len(names)
    side = 1.1 * k + 1.8
    fig, axes = figure(1, len(shown), size=(side * len(shown), side - 0.4))
    for ax, (key, title) in zip(axes.flat, shown.items()):
        values = [[_mean(matrix["cells"], a, b, key) for b in names] for a in names]
        grid = [[math.nan if v is None else v for v, _ in row] for row in values]
        image = ax.imshow(grid, cmap="viridis", origin="upper")
        fig.colorbar(image, ax=ax, shrink=0.8)
        finite = [v for row in grid for v in row if not math.isnan(v)]
        middle = (min(finite) + max(finite)) / 2 if finite else 0.0
        for i, row in enumerate(values):
            for j, (v, n) in enumerate(row):
                if v is not None:
                    color = "black" if v > middle else "white"
                    ax.text(
                        j,
                        i,
                        f"{v:.3g}\nn={n}",
                        ha="center",
                        va="center",
                        color=color,
                        fontsize=FONT - 1,
                    )
        ax.set_xticks(range(k), names, fontsize=FONT)
        ax.set_yticks(range(k), names, fontsize=FONT)
        ax.set_title(f"mean barrier, {title}", fontsize=FONT)
    return fig


def _mean(cells: dict, a: str, b: str, key: str) -> tuple:
    s = (cells.get((a, b, "different")) or cells.get((b, a, "different")) or {}).get(key)
    return (None, 0) if s is None or s["mean"] is None else (s["mean"], s["n"])
