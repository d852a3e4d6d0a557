"""``fine_tuning.png`` (``sam-report``): the learning–forgetting trade-off of fine-tuned jobs —
the second task's loss against the rise of the first task's, one curve per pretraining ×
fine-tuning over the learning rates, a panel per model; a colour per pair, a filled marker
where fine-tuning used the pretraining's optimizer, an open one where it did not, a dashed
line where it trained adapters (LoRA, a prompt) rather than every weight."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, PALETTE, figure, natural_key

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_trade_off(table: list[dict]) -> Figure:
    """``table``: results.fine_tuning.rows."""
    models = sorted({r["model"] for r in table}, key=natural_key)
    fig, axes = figure(1, len(models), size=(5.2 * len(models), 4.0))
    for ax, model in zip(axes[0], models):
        curves: dict = {}
        for r in table:
            if r["model"] == model:
                curves.setdefault((r["pretraining"], r["fine_tuning"]), []).append(r)
        for i, ((pretrain, method), members) in enumerate(sorted(curves.items())):
            points = sorted(
                (m["lr"] or 0, m["loss_rise"]["mean"], m["new_loss"]["mean"])
                for m in members
                if finite(m["loss_rise"]["mean"]) and finite(m["new_loss"]["mean"])
            )
            if not points:
                continue
            color = PALETTE[i % len(PALETTE)]
            same = members[0]["same_optimizer"]
            ax.plot(
                [p[1] for p in points],
                [p[2] for p in points],
                marker="o",
                color=color,
                linestyle="-" if method.startswith("full") else "--",
                markerfacecolor=color if same else "white",
                markeredgecolor=color,
                label=f"{pretrain} → {method}",
            )
            for lr, x, y in points:
                ax.annotate(f"{lr:g}", (x, y), fontsize=FONT - 3, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
        ax.set_title(f"model={model}", fontsize=FONT)
        ax.set_xlabel("first task: test-loss rise (forgetting)", fontsize=FONT)
        ax.set_ylabel("second task: training loss (learning)", fontsize=FONT)
        ax.legend(fontsize=FONT - 2, frameon=False)
    fig.suptitle(
        "Learning against forgetting (pretraining → fine-tuning; labels: the learning rate)",
        fontsize=FONT + 1,
    )
    return fig
