"""``sharpness_dim.png`` (``sam-report``): the sharpness dimension against the step size η, one
line per (variant, batch size), and against the generalization gap, one point per job; a colour
per batch size (the study's axis), a marker per variant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, PALETTE, figure, natural_key

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MARKERS = "osD^v<>"


def plot_sharpness_dim(lines: dict, points: list, key: str) -> Figure:
    """``lines``: results.sharpness_dim.lines_by_step; ``points``: the jobs with ``key``."""
    fig, axes = figure(1, 2, size=(10.0, 3.8))
    left, right = axes[0, 0], axes[0, 1]
    batches = sorted({str(b) for _, b in lines} | {_batch(p) for p in points}, key=natural_key)
    variants = sorted({v for v, _ in lines} | {p.variant for p in points})

    def style(variant, batch):
        return {
            "marker": MARKERS[variants.index(variant) % len(MARKERS)],
            "color": PALETTE[batches.index(str(batch)) % len(PALETTE)],
        }

    for (variant, batch), rows in lines.items():
        left.plot(
            [r[0] for r in rows],
            [r[1] for r in rows],
            markeredgecolor="black",
            label=f"{variant}, batch {batch}",
            **style(variant, batch),
        )
    left.set_xlabel("step size η (base_optimizer.lr)", fontsize=FONT)
    left.set_ylabel("sharpness dimension", fontsize=FONT)
    if lines:
        left.legend(fontsize=FONT - 1, frameon=False)
    groups: dict = {}  # one scatter per (variant, batch), not one per job
    for p in points:
        if finite(p.gen_gap):
            groups.setdefault((p.variant, _batch(p)), []).append((p.values[key], p.gen_gap))
    for (variant, batch), xy in groups.items():
        x, y = zip(*xy)
        right.scatter(x, y, edgecolor="black", s=30, **style(variant, batch))
    right.set_xlabel("sharpness dimension (colours as on the left)", fontsize=FONT)
    right.set_ylabel("gen. gap (train − test acc.)", fontsize=FONT)
    fig.suptitle(
        "Sharpness dimension against the step size and the generalization gap", fontsize=FONT + 1
    )
    return fig


def _batch(point) -> str:
    return str(point.settings.get("dataset.batch_size", "—"))
