"""The figures of sam-landscape, drawn with matplotlib's Agg canvas (no display, pyplot left
alone) and written atomically by ``plots.style.save_figure`` (PNG, PDF or SVG: ``plots.format``).

Our choices: the loss axes are logarithmic when the values span more than a decade (a slice
runs from the minimum to losses tens of times higher); the 2-D contours use logarithmically
spaced levels for the same reason; the surface is drawn in log10 of the loss over more than a
decade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..plots.style import figure, log_scale, save_figure

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure
    from mpl_toolkits.mplot3d.axes3d import Axes3D

__all__ = ["plot_slice_1d", "plot_contours", "plot_surface", "plot_connectivity", "save_figure"]

TRAIN, TEST = "C0", "C3"


def _figure(size, ncols=1, projection=None):
    kw = {"subplot_kw": {"projection": projection}} if projection else {}
    fig, axes = figure(1, ncols, size, **kw)
    return fig, list(axes[0])


def _loss_axis(ax, *series) -> None:
    vals = np.concatenate([np.asarray(s, dtype=float).ravel() for s in series])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if len(vals) and vals.max() / vals.min() > 10:
        log_scale(ax, "y", list(vals))
    ax.set_ylabel("loss (log scale)" if ax.get_yscale() == "log" else "loss")


def plot_slice_1d(
    coords: Sequence[float] | np.ndarray, values: np.ndarray, title: str, xlabel: str, basin: dict
) -> Figure:
    """Loss and accuracy along one direction, train and test; the basin shaded, θ marked."""
    fig, (ax_loss, ax_acc) = _figure((11.0, 4.4), 2)
    x = np.asarray(coords)
    lo, hi = basin["basin_edges"]
    at_least = "≥ " if basin["basin_clipped"] else ""
    for ax in (ax_loss, ax_acc):
        ax.axvspan(
            lo,
            hi,
            color="C2",
            alpha=0.12,
            label=f"basin, width {at_least}{basin['basin_width']:.3g}",
        )
        ax.axvline(0, color="black", linestyle=":", linewidth=1, label="θ (the run)")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    ax_loss.plot(x, values[:, 0], color=TRAIN, label="train (subset)")
    ax_loss.plot(x, values[:, 1], color=TEST, linestyle="--", label="test")
    _loss_axis(ax_loss, values[:, 0], values[:, 1])
    ax_loss.set_title("loss")
    ax_loss.legend(fontsize=8)
    ax_acc.plot(x, values[:, 2], color=TRAIN, label="train (subset)")
    ax_acc.plot(x, values[:, 3], color=TEST, linestyle="--", label="test")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_title("accuracy")
    ax_acc.legend(fontsize=8, loc="lower center")
    fig.suptitle(title + "\nbasin: train loss ≤ L(θ) + 0.1", fontsize=11)
    return fig


def _levels(z, n: int = 14):
    z = z[np.isfinite(z) & (z > 0)]
    lo, hi = float(z.min()), float(z.max())
    if hi <= lo * 1.0001:
        return np.linspace(lo * 0.999, hi * 1.001 + 1e-12, 3)
    return np.geomspace(lo, hi, n)


def plot_contours(
    xs: np.ndarray, ys: np.ndarray, values: np.ndarray, title: str, xlabel: str, ylabel: str
) -> Figure:
    """Filled contours of the train and the test loss over the plane, labelled levels, a
    colorbar each; θ marked at the origin."""
    from matplotlib.colors import LogNorm

    fig, axes = _figure((12.0, 5.2), 2)
    for ax, k, name in zip(axes, (0, 1), ("train loss (subset)", "test loss")):
        z = values[:, :, k]
        levels = _levels(z)
        filled = ax.contourf(
            xs, ys, z, levels=levels, norm=LogNorm(), cmap="viridis", extend="both"
        )
        lines = ax.contour(xs, ys, z, levels=levels[::2], colors="white", linewidths=0.7)
        ax.clabel(lines, fmt="%.3g", fontsize=7)
        fig.colorbar(filled, ax=ax, label=name, format="%.3g")
        ax.plot([0], [0], marker="x", color="red", markersize=9, mew=2, label="θ (the run)")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.set_aspect("equal")
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


def plot_surface(xs: np.ndarray, ys: np.ndarray, values: np.ndarray, title: str) -> Figure:
    """The train loss over the plane as a 3-D surface (log10 of it over more than a decade)."""
    fig, (ax,) = _figure((7.5, 6.6), 1, projection="3d")
    X, Y = np.meshgrid(xs, ys)
    Z, name = values[:, :, 0], "train loss (subset)"
    finite = Z[np.isfinite(Z) & (Z > 0)]
    if len(finite) and finite.max() / finite.min() > 10:
        Z, name = np.log10(np.clip(Z, 1e-12, None)), "log10 train loss (subset)"
    surface = ax.plot_surface(X, Y, Z, cmap="viridis", linewidth=0, antialiased=True)
    fig.colorbar(surface, ax=ax, shrink=0.6, pad=0.1, label=name)
    ax.set_xlabel("α (direction 1)")
    ax.set_ylabel("β (direction 2)")
    ax.set_zlabel(name, labelpad=8)
    fig.suptitle(title, fontsize=9)
    ax.view_init(elev=view_elevation(ax, X, Y, Z), azim=AZIM)
    return fig


ELEV, AZIM, MARGIN = 32.0, -60.0, 4.0  # degrees: the usual view; the margin over the steepest face


def view_elevation(
    ax: Axes3D, X: np.ndarray, Y: np.ndarray, Z: np.ndarray, azim: float = AZIM
) -> float:
    """The lowest elevation, from ``ELEV`` up, at which every face of the surface is seen from
    above. From a lower one, where the surface rises towards the viewer more steeply than the
    line of sight (a near edge higher than the valley behind it), the line of sight passes under
    that edge and meets the surface's underside: the valley shows through the near edge, which
    reads as an artefact at the plot's edge. A face is seen from above when its upward normal
    points towards the viewer: tan(elev) > the face's rise towards the viewer, measured in the
    axes box's units (what the projection sees: each axis scaled to its box side) and over both
    edges of each cell in each direction; plus ``MARGIN`` for the perspective's rays."""
    box = ax.get_box_aspect()
    lims = (ax.get_xlim3d(), ax.get_ylim3d(), ax.get_zlim3d())
    sx, sy, sz = (side / (hi - lo) for side, (lo, hi) in zip(box, lims))
    Zs = np.where(np.isfinite(Z), Z, np.nan) * sz
    gx = np.diff(Zs, axis=1) / (np.diff(X, axis=1) * sx)  # rise along α, each cell's two edges
    gy = np.diff(Zs, axis=0) / (np.diff(Y, axis=0) * sy)
    a = np.radians(azim)
    # the viewer sits towards (cos a, sin a) from the box centre: each cell's rise towards it,
    # the largest over its edges' slopes
    rise = np.full(gx[:-1].shape, -np.inf)
    for ex in (gx[:-1], gx[1:]):
        for ey in (gy[:, :-1], gy[:, 1:]):
            rise = np.fmax(rise, np.cos(a) * ex + np.sin(a) * ey)
    rise = rise[np.isfinite(rise)]
    steepest = float(rise.max()) if len(rise) else 0.0
    return float(min(90.0, max(ELEV, np.degrees(np.arctan(max(steepest, 0.0))) + MARGIN)))


def _end_lines(ax, alphas, v) -> None:
    """The straight line between the end values (what the barrier is measured against)."""
    a = np.asarray(alphas)
    i0, i1 = int(np.flatnonzero(a == 0)[0]), int(np.flatnonzero(a == 1)[0])
    ax.plot([0, 1], [v[i0], v[i1]], color="gray", linestyle=":", linewidth=1)


def _not_finite_note(ax, alphas, v) -> None:
    """Say where the loss is not finite (not drawn): e.g. BatchNorm running variances
    extrapolated beyond the end points can fall below 0."""
    bad = np.asarray(alphas)[~np.isfinite(v)]
    if len(bad):
        where = (  # a few points by name: a range would suggest every point between
            "α = " + ", ".join(f"{a:g}" for a in bad)
            if len(bad) <= 6
            else f"{len(bad)} points, α in [{bad.min():g}, {bad.max():g}]"
        )
        ax.text(
            0.5,
            0.02,
            f"not finite at {where} (not drawn)",
            transform=ax.transAxes,
            ha="center",
            va="bottom",
            fontsize=8,
            color="0.3",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},  # over the lines
        )


def plot_connectivity(
    alphas: Sequence[float] | np.ndarray,
    values: np.ndarray,
    title: str,
    curve: tuple[np.ndarray, np.ndarray] | None = None,
) -> Figure:
    """Loss and error along α (θ_A at 0, θ_B at 1), train and test; ``curve``: (t, values) of a
    Bézier curve, drawn over the same axis."""
    fig, (ax_loss, ax_err) = _figure((11.0, 5.0), 2)
    a = np.asarray(alphas)
    panels = ((ax_loss, (0, 1), lambda v: v, "loss"), (ax_err, (2, 3), lambda v: 1 - v, "error"))
    for ax, (i, j), f, name in panels:
        ax.axvspan(0, 1, color="0.92", zorder=0, label="between the runs (0 ≤ α ≤ 1)")
        for k, color, style, split in ((i, TRAIN, "-", "train (subset)"), (j, TEST, "--", "test")):
            ax.plot(
                a,
                f(values[:, k]),
                color=color,
                linestyle=style,
                marker="o",
                markersize=3,
                label=f"line, {split}",
            )
            _end_lines(ax, a, f(values[:, k]))
            if curve is not None:
                ax.plot(
                    curve[0],
                    f(curve[1][:, k]),
                    color=color,
                    linestyle=style,
                    alpha=0.6,
                    marker="s",
                    markersize=3,
                    label=f"Bézier curve, {split}",
                )
        ax.set_xlabel("α  (0: run A, 1: run B)")
        ax.set_xlim(a.min() - 0.02 * np.ptp(a), a.max() + 0.02 * np.ptp(a))
        ax.set_title(name + "  (dotted: the straight line between the end values)", fontsize=9)
        ax.grid(alpha=0.3)
        # below the axes: the curves fill the panel
        ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    _loss_axis(ax_loss, values[:, 0], values[:, 1])
    # NaN where the logits are: left out of both panels alike, and said on both
    _not_finite_note(ax_loss, a, values[:, 0] + values[:, 1])
    _not_finite_note(ax_err, a, values[:, 2] + values[:, 3])
    ax_err.set_ylabel("error (1 − accuracy)")
    fig.suptitle(title, fontsize=10)
    return fig
