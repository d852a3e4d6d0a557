"""The numbers a table can use, from the values along a line (numpy only, no torch).

Our choices, all of them (the papers draw the pictures; these summaries are ours):

- grid: ``n`` evenly spaced coordinates over [lo, hi] (rounded to 12 decimals); a coordinate
  within 1e-9 of the span of
  a point the grid must hold (0, the run itself; ½ and 1 between two runs) is set to it
  exactly, and a point the grid misses is added.
- curvature at 0: κ = 2c of the least-squares quadratic a + b·x + c·x² through the points
  with |x| ≤ ``radius`` (at least the ``MIN_FIT_POINTS`` nearest to 0). For a loss that is
  quadratic along the line, κ is its second derivative exactly.
- basin width: the length of the interval around 0 on which the loss stays ≤ L(0) + ``rise``
  (0.1), its two ends linearly interpolated between the last grid point inside and the first
  outside. ``clipped``: the loss stayed under the level up to an end of the grid, so the width
  is a lower bound.
- barrier between two end points: max over the grid points with α ∈ [0, 1] of
  v(α) − [(1 − α)·v(0) + α·v(1)] (the straight line between the end values, computed as a
  lerp: identical end values give exactly 0).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

RISE = 0.1
MIN_FIT_POINTS = 5


def grid(lo: float, hi: float, n: int, must: Sequence[float] = (0.0,)) -> np.ndarray:
    """``n`` evenly spaced points over [lo, hi] holding every point of ``must`` exactly (rounded
    to 12 decimals: 0.15, not 0.15000000000000002, is the point evaluated and written)."""
    x = np.round(np.linspace(lo, hi, n), 12)
    tol = 1e-9 * (hi - lo)
    for m in must:
        near = np.abs(x - m) <= tol
        if near.any():
            x[near] = m
        else:
            x = np.sort(np.append(x, m))
    return x


def index_of(coords: Sequence[float] | np.ndarray, value: float) -> int:
    """The index of the grid point ``value`` in ``coords`` (ValueError when it is not one)."""
    hits = np.flatnonzero(np.asarray(coords) == value)
    if not len(hits):
        raise ValueError(f"{value} is not a grid point")
    return int(hits[0])


def quadratic_curvature(
    coords: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, radius: float
) -> dict:
    """κ of the quadratic fit at 0 and the number of points it used (see the module)."""
    x, v = np.asarray(coords, dtype=float), np.asarray(values, dtype=float)
    order = np.argsort(np.abs(x), kind="stable")
    n = max(MIN_FIT_POINTS, int((np.abs(x) <= radius * (1 + 1e-9)).sum()))
    use = [i for i in order[:n] if math.isfinite(v[i])]
    if len(use) < 3:
        return {"curvature": None, "fit_points": len(use)}
    c2 = np.polyfit(x[use], v[use], 2)[0]
    return {"curvature": float(2 * c2), "fit_points": len(use)}


def _edge(x, v, level: float) -> tuple[float, bool]:
    """From x[0] (the centre) outwards along increasing |x|: where v first rises above
    ``level`` (interpolated), or the grid's end (clipped)."""
    for i in range(1, len(x)):
        if not v[i] <= level:  # a NaN is outside too
            if not math.isfinite(v[i]):
                return float(x[i - 1]), False
            frac = (level - v[i - 1]) / (v[i] - v[i - 1])
            return float(x[i - 1] + frac * (x[i] - x[i - 1])), False
    return float(x[-1]), True


def basin(
    coords: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, rise: float = RISE
) -> dict:
    """The basin of the loss at L(0) + ``rise`` along a line: its width, ends and ``clipped``."""
    x, v = np.asarray(coords, dtype=float), np.asarray(values, dtype=float)
    i0 = index_of(x, 0.0)
    level = v[i0] + rise
    right, r_clip = _edge(x[i0:], v[i0:], level)
    left, l_clip = _edge(-x[i0::-1], v[i0::-1], level)
    return {
        "basin_width": right + left,
        "basin_edges": [-left, right],
        "basin_clipped": bool(r_clip or l_clip),
    }


def line_summary(
    coords: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    radius: float,
    rise: float = RISE,
) -> dict:
    """Curvature at 0 and basin width of one line (the loss along one direction)."""
    return {**quadratic_curvature(coords, values, radius), **basin(coords, values, rise)}


def barrier(alphas: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray) -> dict:
    """The barrier of ``values`` between α = 0 and α = 1 and the α where it is highest."""
    a, v = np.asarray(alphas, dtype=float), np.asarray(values, dtype=float)
    v0, v1 = v[index_of(a, 0.0)], v[index_of(a, 1.0)]
    inside = (a >= 0) & (a <= 1)
    a, v = a[inside], v[inside]
    line = np.where(a < 0.5, v0 + a * (v1 - v0), v1 - (1 - a) * (v1 - v0))
    rise = v - line
    if not np.isfinite(rise).all():
        return {"barrier": None, "alpha": None}
    j = int(np.argmax(rise))
    return {"barrier": float(rise[j]), "alpha": float(a[j])}
