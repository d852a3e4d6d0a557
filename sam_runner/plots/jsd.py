"""``jsd.png`` (``sam-report``): one panel per measure (λ_max, the Fisher trace ratio) against
α(1−α), one line per SAM variant in its colour through the means at each α(1−α) (α and 1 − α
averaged), the per-α means with their std as markers (circles: α ≤ ½, squares: α > ½), and each
variant's jobs without the regularizer as a dashed line (results/jsd.py)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from .style import FONT, figure, variant_color

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_jsd(points: dict, shown: dict) -> Figure:
    """One panel per key of ``shown`` against α(1−α), one line per variant, its jobs without the
    regularizer as a horizontal line."""
    keys = list(shown)
    fig, axes = figure(1, len(keys), size=(4.6 * len(keys), 3.6))
    variants = sorted({v for v, _ in points["rows"]}, key=lambda v: (v != "base", v))
    for ax, key in zip(axes.flat, keys):
        for variant in variants:
            color = variant_color(variant)
            line: dict = {}
            for (v, alpha), row in points["rows"].items():
                s = row[key]
                if v != variant or s["mean"] is None:
                    continue
                x = round(alpha * (1 - alpha), 12)
                line.setdefault(x, []).append(s["mean"])
                ax.errorbar(
                    x,
                    s["mean"],
                    yerr=s["std"] or 0,
                    color=color,
                    capsize=3,
                    marker="o" if alpha <= 0.5 else "s",
                    markerfacecolor="none",
                )
            xs = sorted(line)
            ax.plot(xs, [statistics.fmean(line[x]) for x in xs], color=color, label=variant)
            ref = points["reference"].get(variant, {}).get(key)
            if ref and ref["mean"] is not None:
                ax.axhline(
                    ref["mean"],
                    color=color,
                    linestyle="--",
                    linewidth=1,
                    label=f"{variant}, no JSD",
                )
        ax.set_xlabel("α(1−α)", fontsize=FONT)
        ax.set_ylabel(shown[key], fontsize=FONT)
        ax.set_title(f"{shown[key]} against α(1−α)", fontsize=FONT)
    axes[0, -1].legend(
        fontsize=FONT - 1, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False
    )
    return fig
