"""``circuits.png`` (``sam-report``, results/circuits.py): per training setting (base optimizer,
regularizer, weight) the sharpness −tr H split by the depth of the sum nodes (stacked bars, the
root first) beside the test bits per dimension (mean ± std over seeds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .style import FONT, figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_circuits(rows: dict, depth: int) -> Figure:
    """circuits.png: −tr H by depth (stacked bars) beside the test bits per dimension, per
    setting."""
    labels = [f"{base} · {reg} · {weight:g}" for base, reg, weight in rows]
    fig, axes = figure(1, 2, size=(11.0, 0.45 * len(rows) + 1.6))
    sharp, bpd = axes[0, 0], axes[0, 1]
    ys = list(range(len(rows)))
    left = [0.0] * len(rows)
    for t in range(depth):
        widths = [-(r[f"hessian_trace_depth_{t}"]["mean"] or 0.0) for r in rows.values()]
        sharp.barh(ys, widths, left=left, label=f"depth {t}", color=f"C{t}")
        left = [a + b for a, b in zip(left, widths)]
    sharp.set_yticks(ys, labels, fontsize=FONT - 1)
    sharp.invert_yaxis()
    sharp.set_xlabel("−tr H (sum weights), by depth", fontsize=FONT)
    sharp.legend(fontsize=FONT - 1, frameon=False)
    means = [r["test_bpd"]["mean"] for r in rows.values()]
    errs = [r["test_bpd"]["std"] or 0.0 for r in rows.values()]
    bpd.errorbar(means, ys, xerr=errs, fmt="o", color="C0", capsize=3)
    bpd.set_yticks(ys, [""] * len(ys))
    bpd.invert_yaxis()
    bpd.set_xlabel("test bits per dimension", fontsize=FONT)
    return fig
