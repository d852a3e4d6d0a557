"""surface_2d's view: every face of the surface seen from above (no valley showing through a
near edge, the artefact of the image-folder runs' surfaces), the usual view where it already is
(the axes box scales z to its height, so only the shape counts, not the loss's range)."""

import numpy as np
import pytest

from sam_runner.landscape.plots import ELEV, plot_surface


def faces_seen_from_below(ax, X, Z, elev) -> int:
    """Triangles of the drawn grid (both diagonals of every cell) whose upward normal, in the
    axes box's units, points away from a viewer at ``elev`` and the axes' azimuth."""
    box = np.asarray(ax.get_box_aspect())
    lims = np.array([ax.get_xlim3d(), ax.get_ylim3d(), ax.get_zlim3d()])
    P = np.stack([X, X.T, Z], -1)  # X.T: the meshgrid's Y of a square grid
    P = (P - lims[:, 0]) / (lims[:, 1] - lims[:, 0]) * box
    e, a = np.radians(elev), np.radians(ax.azim)
    eye = np.array([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)])
    p00, p10, p01, p11 = P[:-1, :-1], P[:-1, 1:], P[1:, :-1], P[1:, 1:]
    count = 0
    for a0, a1, a2 in ((p00, p10, p11), (p00, p11, p01), (p00, p10, p01), (p10, p11, p01)):
        n = np.cross(a1 - a0, a2 - a0)
        n *= np.sign(n[..., 2:3])  # upward
        count += int((n @ eye <= 0).sum())
    return count


def surface(Z):
    xs = np.linspace(-1, 1, Z.shape[0])
    values = np.repeat(Z[:, :, None], 4, -1)
    fig = plot_surface(xs, xs, values, "t")
    X, _ = np.meshgrid(xs, xs)
    plotted = np.log10(Z) if Z.max() / Z.min() > 10 else Z
    return fig.axes[0], X, plotted


def test_a_steep_near_edge_is_drawn_from_high_enough_that_nothing_shows_through():
    # a bowl whose minimum sits off centre, away from the viewer (at +α, −β): the near edge rises
    # steeply over the valley, as on a one-epoch image-folder run over a wide span
    xs = np.linspace(-1, 1, 11)
    X, Y = np.meshgrid(xs, xs)
    Z = 0.6 + 30 * ((X + 0.3) ** 2 + (Y - 0.3) ** 2)
    ax, Xm, plotted = surface(Z)
    assert faces_seen_from_below(ax, Xm, plotted, ELEV) > 0  # the old fixed view shows through
    assert ax.elev > ELEV and faces_seen_from_below(ax, Xm, plotted, ax.elev) == 0


def test_a_surface_falling_towards_the_viewer_keeps_the_usual_view():
    xs = np.linspace(-1, 1, 11)
    X, Y = np.meshgrid(xs, xs)
    ax, Xm, plotted = surface(1.0 + 0.1 * (Y - X) + 0.02 * X * Y)
    assert ax.elev == pytest.approx(ELEV) and faces_seen_from_below(ax, Xm, plotted, ELEV) == 0
