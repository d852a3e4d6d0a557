"""``joint.png`` (``sam-report``): two heat maps over (sharpness measure × complexity measure),
R² of gen_gap on both, and the Pareto agreement, each cell annotated with its value."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .style import FONT, figure

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from matplotlib.figure import Figure


def plot_joint(
    rows: list[dict],
    label: Callable[[str], str],
    sharpness_order: Sequence[str],
    complexity_order: Sequence[str],
) -> Figure:
    """The figure of ``results.joint.joint_rows``' rows, the measures in the orders given;
    ``label(key)`` names a measure."""
    sharp = [k for k in sharpness_order if any(r["sharpness"] == k for r in rows)]
    comp = [k for k in complexity_order if any(r["complexity"] == k for r in rows)]
    cell = {(r["sharpness"], r["complexity"]): r for r in rows}
    fig, axes = figure(1, 2, size=(2.2 * len(comp) + 6.0, 0.5 * len(sharp) + 2.2))
    for ax, key, title in (
        (axes[0, 0], "r2", "R² of gen_gap on both"),
        (axes[0, 1], "pareto_agreement", "Pareto agreement"),
    ):
        grid = [[_value(cell.get((s, c)), key) for c in comp] for s in sharp]
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                text = "—" if math.isnan(v) else f"{v:.2f}"
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=FONT - 1,
                    color="white" if not math.isnan(v) and v < 0.5 else "black",
                )
        ax.set_xticks(
            range(len(comp)), [label(c) for c in comp], rotation=30, ha="right", fontsize=FONT - 1
        )
        ax.set_yticks(range(len(sharp)), [label(s) for s in sharp], fontsize=FONT - 1)
        ax.set_title(title, fontsize=FONT)
        fig.colorbar(image, ax=ax, shrink=0.8)
    n = max(r["n"] for r in rows)
    fig.suptitle(f"Sharpness and complexity together (up to {n} jobs)", fontsize=FONT + 1)
    return fig


def _value(row, key) -> float:
    v = None if row is None else row.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan
