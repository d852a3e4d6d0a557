"""The accuracy-per-compute figure of ``sam-report``: test accuracy and λ_max against the
gradient evaluations, one point per group in its variant's colour, the Pareto front drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, figure, log_scale, variant_color

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANELS = (("test_acc", "test accuracy", True), ("lambda_max", "λ_max (log scale)", False))


def _short(label: str) -> str:
    """A one-override label by its value (``+cheaper=sam_every2`` → ``sam_every2``)."""
    return label.split("=", 1)[1] if " " not in label and "=" in label else label


def plot_compute(points: list[dict], fronts: dict) -> Figure:
    """``points``: results/compute.py's; ``fronts``: key → on-the-front flags, one per point."""
    fig, axes = figure(1, 2, size=(11.0, 4.5))
    for ax, (key, label, _) in zip(axes[0], PANELS):
        shown = [(p, on) for p, on in zip(points, fronts[key]) if finite(p[key])]
        for variant in dict.fromkeys(p["variant"] for p, _ in shown):
            mine = [p for p, _ in shown if p["variant"] == variant]
            ax.scatter(
                [p["evals"] for p in mine],
                [p[key] for p in mine],
                label=variant,
                color=variant_color(variant),
                edgecolors="black",
                linewidths=0.3,
                zorder=3,
            )
        for p, _ in shown:
            ax.annotate(_short(p["label"]), (p["evals"], p[key]), fontsize=FONT - 3, alpha=0.8,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
        front = sorted((p["evals"], p[key]) for p, on in shown if on)
        if front:
            ax.step([e for e, _ in front], [v for _, v in front], where="post", color="grey",
                    linestyle="--", linewidth=1, label="Pareto front", zorder=2)  # fmt: skip
        if key == "lambda_max" and shown:
            log_scale(ax, "y", [p[key] for p, _ in shown])
        ax.set_xlabel("gradient evaluations (forward-backward passes over the run)", fontsize=FONT)
        ax.set_ylabel(label, fontsize=FONT)
        ax.grid(alpha=0.3)
    axes[0, 0].set_title("test accuracy per compute", fontsize=FONT + 1)
    axes[0, 1].set_title("λ_max per compute", fontsize=FONT + 1)
    if axes[0, 1].get_legend_handles_labels()[0]:  # none where no job measured λ_max
        axes[0, 1].legend(
            fontsize=FONT, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False
        )
    return fig
