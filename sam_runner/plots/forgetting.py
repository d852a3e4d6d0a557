"""``forgetting.png`` of ``sam-report``: per mid-training setting, the first task's accuracy lost
in post-training and the accuracy its mid-trained weights lose when quantized; bars are means
over seeds, whiskers ± one sample std, each setting in its variant's colour."""

from __future__ import annotations

from ..runfiles import finite
from .style import FONT, figure, variant_color


def plot_forgetting(table: list[dict]):
    """``table``: results/forgetting.py's rows."""
    keys = [k for k in table[0]["stats"] if k == "forgetting_acc" or k.startswith("quant_drop")]
    fig, axes = figure(1, len(keys), size=(0.9 + 0.8 * len(table) * len(keys) + 1.2, 3.6))
    names = [r["midtraining"] for r in table]
    for ax, key in zip(axes[0], keys):
        means = [r["stats"][key]["mean"] for r in table]
        stds = [r["stats"][key]["std"] for r in table]
        ax.bar(
            range(len(table)),
            [m if finite(m) else 0 for m in means],
            yerr=[s if finite(s) else 0 for s in stds],
            color=[variant_color(r["variant"]) for r in table],
            edgecolor="black",
            linewidth=0.4,
            capsize=3,
        )
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(table)), names, rotation=30, ha="right", fontsize=FONT - 1)
        bits = key.removeprefix("quant_drop_").removesuffix("bit")
        title = "forgetting after post-training" if key == "forgetting_acc" else f"{bits}-bit drop"
        ax.set_title(title, fontsize=FONT)
        ax.set_ylabel("test accuracy lost", fontsize=FONT)
        ax.grid(alpha=0.3, axis="y")
    fig.supxlabel(
        "mid-training (bars: mean over seeds; whiskers: ± 1 sample std)", fontsize=FONT - 1
    )
    return fig
