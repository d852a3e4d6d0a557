"""``weight_decay.png`` (``sam-report``, the ``ouidecay`` presets): the OUI by epoch, one line per
group (mean over seeds), and each layer's final weight-decay multiple, one line of markers per
OUIDecay group with the seeds' std as error bars (results/weight_decay.py)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from .style import FONT, figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_weight_decay(groups: list[dict]) -> Figure:
    """The OUI by epoch beside each layer's decay multiple, per group."""
    fig, axes = figure(1, 2, size=(10.0, 3.8))
    ax_oui, ax_layers = axes[0]
    layers = list(dict.fromkeys(k for g in groups for k in g["layers"]))
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        if g["oui"]:
            xs = sorted(g["oui"])
            ys = [statistics.fmean(g["oui"][x]) for x in xs]
            ax_oui.plot(xs, ys, color=color, marker=".", label=g["label"])
        if g["layers"]:
            pts = [(n, g["layers"][k]) for n, k in enumerate(layers) if k in g["layers"]]
            ax_layers.errorbar(
                [n + 0.08 * (i - len(groups) / 2) for n, _ in pts],  # side by side, not hidden
                [s["mean"] for _, s in pts],
                yerr=[s["std"] or 0 for _, s in pts],
                color=color,
                marker="o",
                capsize=3,
                linestyle="-",
                linewidth=0.8,
                label=g["label"] if not g["oui"] else None,
            )
    ax_oui.set_xlabel("epoch", fontsize=FONT)
    ax_oui.set_ylabel("OUI (mean over layers)", fontsize=FONT)
    ax_oui.set_title("OUI during training", fontsize=FONT)
    ax_oui.grid(alpha=0.3)
    ax_layers.axhline(1.0, color="0.5", linestyle="--", linewidth=1, label="constant decay")
    ax_layers.set_xticks(range(len(layers)), layers, rotation=45, ha="right", fontsize=FONT - 1)
    ax_layers.set_ylabel("final decay / base λ", fontsize=FONT)
    ax_layers.set_title("each layer's weight decay at the end", fontsize=FONT)
    ax_layers.grid(alpha=0.3, axis="y")
    # one legend for both panels: a group has one colour in each
    handles, labels = ax_oui.get_legend_handles_labels()
    for handle, label in zip(*ax_layers.get_legend_handles_labels()):
        if label not in labels:
            handles.append(handle)
            labels.append(label)
    ax_layers.legend(
        handles, labels, fontsize=FONT - 2, loc="upper left", bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )  # fmt: skip
    return fig
