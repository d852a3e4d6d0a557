"""``forgetting.png`` of ``sam-report``: per mid-training setting, the first task's accuracy lost
in post-training and the accuracy its mid-trained weights lose when quantized (a language
model: the test-loss rises instead); bars are means over seeds, whiskers ± one sample std, each
setting in its variant's colour."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, figure, variant_color

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_forgetting(table: list[dict]) -> Figure:
    """``table``: results/forgetting.py's rows."""
    lm = "ppl_before" in table[0]["stats"]  # a language model: its losses, not token accuracy
    first, quantized = (
        ("loss_rise", "quant_loss_rise_") if lm else ("forgetting_acc", "quant_drop_")
    )
    keys = [k for k in table[0]["stats"] if k == first or k.startswith(quantized)]
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
            ecolor="0.55",  # grey: seen on the base's black bar and on the variants' colours
        )
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(table)), names, rotation=30, ha="right", fontsize=FONT - 1)
        bits = key.removeprefix(quantized).removesuffix("bit")
        title = "forgetting after post-training" if key == first else f"{bits}-bit rounding"
        ax.set_title(title, fontsize=FONT)
        ax.set_ylabel("test loss rise (nats)" if lm else "test accuracy lost", fontsize=FONT)
        ax.grid(alpha=0.3, axis="y")
    fig.supxlabel(
        "mid-training (bars: mean over seeds; whiskers: ± 1 sample std)", fontsize=FONT - 1
    )
    return fig
