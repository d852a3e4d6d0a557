"""sam-landscape's figures, drawn from the files of a landscape folder (never from live state):
the slices from slice_1d.csv, slice_2d.npz and landscape.json; a pair from connectivity.csv,
bezier.csv and landscape.json. So a figure always shows what the folder's files hold, and a
finished folder asked for in another ``plots.format`` is drawn again without computing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..rundir import run_label
from ..runfiles import read_json
from .files import SUMMARY, read_columns

if TYPE_CHECKING:
    from collections.abc import Iterable

SLICE_FIGURES = {"1d": ("slice_1d",), "2d": ("slice_2d", "surface_2d")}


def describe_direction(info: dict) -> str:
    """How a direction was made, for an axis label: a seeded random direction, or an eigenvector
    with its λ."""
    if "seed" in info:
        return f"filter-normalized random direction, seed {info['seed']}"
    return f"{info['kind'].lower()}, λ = {info['eigenvalue']:.4g}"


def axis_label(symbol: str, info: dict) -> str:
    """An axis label: the coordinate's symbol and how its direction was made."""
    return f"{symbol}  ({describe_direction(info)})"


def slice_figures(slices: str = "both") -> list[str]:
    """The figure stems of the slices a call draws (``slices``: 1d, 2d or both)."""
    return [s for dim, stems in SLICE_FIGURES.items() if slices in (dim, "both") for s in stems]


def drawn(out: Path, stems: Iterable[str], fmt: str) -> bool:
    """Whether every figure of ``stems`` is in ``out`` in format ``fmt``."""
    return all((Path(out) / f"{stem}.{fmt}").is_file() for stem in stems)


def draw_slices(out: Path, fmt: str, slices: str = "both") -> list[Path]:
    """The figures of the slices ``slices`` names that the folder holds, in ``fmt``."""
    from .plots import plot_contours, plot_slice_1d, plot_surface, save_figure

    out = Path(out)
    summary = read_json(out / SUMMARY) or {}
    label, written = run_label(summary), []
    one = summary.get("slice_1d")
    if slices in ("1d", "both") and one and (out / "slice_1d.csv").is_file():
        x, values = read_columns(out / "slice_1d.csv")
        xlabel = axis_label("α", one["direction"])
        fig = plot_slice_1d(x, values, f"Loss along one direction — {label}", xlabel, one)
        written.append(save_figure(fig, out, "slice_1d", fmt))
    two = summary.get("slice_2d")
    if slices in ("2d", "both") and two and (out / "slice_2d.npz").is_file():
        written += _draw_plane(out, two, label, fmt, plot_contours, plot_surface, save_figure)
    return written


def _draw_plane(out, two, label, fmt, plot_contours, plot_surface, save_figure) -> list[Path]:
    import numpy as np

    from .evaluate import COLUMNS

    with np.load(out / "slice_2d.npz") as npz:
        xs, ys = npz["x"], npz["y"]
        values = np.stack([npz[name] for name in COLUMNS], axis=-1)
    infos = two["directions"]
    xl, yl = axis_label("α", infos[0]), axis_label("β", infos[1])
    contours = plot_contours(xs, ys, values, f"Loss in a plane through θ — {label}", xl, yl)
    axes = [f"{s}: {describe_direction(i)}" for s, i in zip("αβ", infos)]
    title = "\n".join(["Loss in a plane through θ", label, *axes])
    return [
        save_figure(contours, out, "slice_2d", fmt),
        save_figure(plot_surface(xs, ys, values, title), out, "surface_2d", fmt),
    ]


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def barrier_line(what: str, s: dict) -> str:
    """A pair's line of barriers (train loss, test error) for ``what``."""
    return (
        f"{what}: barrier train loss {_fmt(s.get('barrier_train_loss'))}, "
        f"test error {_fmt(s.get('barrier_test_error'))}"
    )


def draw_pair(out: Path, fmt: str) -> Path:
    """connectivity.<fmt> of a pair folder: the line, and the Bézier curve when the folder's
    landscape.json has one."""
    from .plots import plot_connectivity, save_figure

    out = Path(out)
    summary = read_json(out / SUMMARY) or {}
    alphas, values = read_columns(out / "connectivity.csv")
    title = f"A = {run_label(summary.get('run_a') or {})}, B = "
    title += f"{run_label(summary.get('run_b') or {})}\n" + barrier_line("line", summary)
    curve = None
    if summary.get("curve") and (out / "bezier.csv").is_file():
        curve = read_columns(out / "bezier.csv")
        title += ";  " + barrier_line("Bézier curve", summary["curve"])
    return save_figure(plot_connectivity(alphas, values, title, curve), out, "connectivity", fmt)
