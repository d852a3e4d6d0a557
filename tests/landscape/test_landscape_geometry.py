"""The summary numbers: grids, quadratic curvature, basin width, barrier."""

from __future__ import annotations

import numpy as np
import pytest

from sam_runner.landscape.geometry import barrier, basin, grid, quadratic_curvature


def test_grids_hold_their_required_points_exactly():
    x = grid(-1, 1, 51)
    assert len(x) == 51 and (x == 0.0).sum() == 1 and x[0] == -1 and x[-1] == 1
    a = grid(-0.25, 1.25, 31, must=(0.0, 0.5, 1.0))
    assert len(a) == 31 and all((a == m).sum() == 1 for m in (0.0, 0.5, 1.0))
    even = grid(-1, 1, 4)  # misses 0: it is added
    assert len(even) == 5 and 0.0 in even and np.all(np.diff(even) > 0)


def test_quadratic_fit_recovers_a_known_curvature():
    x = grid(-1, 1, 51)
    v = 0.7 - 0.3 * x + 0.5 * 4.2 * x**2
    s = quadratic_curvature(x, v, radius=0.1)
    assert s["curvature"] == pytest.approx(4.2, rel=1e-9) and s["fit_points"] == 5


def test_basin_width_is_interpolated_and_flagged_when_clipped():
    x = grid(-1, 1, 41)
    v = x**2  # L(0) = 0: the basin is |x| <= sqrt(0.1)
    b = basin(x, v)
    # linear interpolation of x² between grid points overestimates the crossing a little
    assert b["basin_width"] == pytest.approx(2 * np.sqrt(0.1), abs=2e-3)
    assert not b["basin_clipped"] and b["basin_edges"][0] == pytest.approx(-b["basin_edges"][1])
    flat = basin(x, np.zeros_like(x))
    assert flat["basin_width"] == 2 and flat["basin_clipped"]


def test_barrier_against_the_straight_line_between_the_ends():
    a = grid(-0.25, 1.25, 31, must=(0.0, 0.5, 1.0))
    v = 1.0 + a + 0.8 * a * (1 - a)  # a line plus a bump of height 0.2 at 1/2
    b = barrier(a, v)
    assert b["barrier"] == pytest.approx(0.2, rel=1e-12) and b["alpha"] == 0.5
    same = barrier(a, np.full_like(a, 0.123456789))
    assert same == {"barrier": 0.0, "alpha": 0.0}
