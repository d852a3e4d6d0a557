"""The federated figures: ``clients.png`` in a federated run's folder (each client's class
histogram, stacked bars, clients by size) and ``federated.png`` in ``sam-report`` (the global
model's test accuracy by round, one line per method, one panel per client split)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from .style import FONT, figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METHOD_COLORS = {"fedavg+base": "0.45", "fedsam": "C0", "fedfft": "C3", "fedvssam": "C2"}


def plot_clients(split: dict) -> Figure:
    """clients.png: each client's class histogram as stacked bars, clients by size."""
    hist = split["class_histograms"]
    k, c = len(hist), len(hist[0]) if hist else 0
    fig, axes = figure(1, 1, size=(min(3 + 0.25 * k, 16), 3.4))
    ax = axes[0, 0]
    bottom = [0] * k
    cmap = __import__("matplotlib").colormaps["tab20" if c > 10 else "tab10"]
    for j in range(c):
        counts = [h[j] for h in hist]
        ax.bar(range(k), counts, bottom=bottom, color=cmap(j % cmap.N), width=0.85, label=str(j))
        bottom = [b + n for b, n in zip(bottom, counts)]
    alpha = split.get("dirichlet_alpha")
    kind = "IID" if alpha is None else f"Dirichlet α = {alpha:g}"
    ax.set_title(f"{k} clients, {kind}: label skew {split['label_skew']:.3f}", fontsize=FONT)
    ax.set_xlabel("client")
    ax.set_ylabel("training samples")
    if c <= 20:
        ax.legend(title="class", fontsize=FONT - 2, ncol=2, loc="upper left", bbox_to_anchor=(1, 1))
    return fig


def plot_rounds(series: dict) -> Figure:
    """``series``: {split label: {method: {round: [test_acc of each seed]}}}."""
    splits = sorted(series)
    fig, axes = figure(1, len(splits), size=(4.6 * len(splits), 3.6), sharey=True)
    for ax, split in zip(axes.flat, splits):
        for method, by_round in sorted(series[split].items()):
            xs = sorted(by_round)
            ys = [statistics.fmean(by_round[x]) for x in xs]
            ax.plot(xs, ys, color=METHOD_COLORS.get(method), label=method, marker=".")
        ax.set_title(split, fontsize=FONT)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("global model's test accuracy")
    axes[0, -1].legend(fontsize=FONT - 1)
    return fig
