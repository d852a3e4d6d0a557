"""Slices of the loss around one run: θ₀ + α·d₁ (1-D) and θ₀ + α·d₁ + β·d₂ (2-D).

Li et al. (2018): plotting the loss along filter-normalized random directions. Ours: the
Hessian-eigenvector option's scaling (directions.py), the grids holding 0 exactly, and the
summary numbers (geometry.py): the basin width and the quadratic curvature along the 1-D
direction and along each axis of the 2-D plane (its lines through θ₀).

Writes into RUN_DIR/landscape/: slice_1d.csv; slice_2d.npz; landscape.json (the settings of
each slice and its summary numbers, merged with what the file held: a 2-D slice drawn later
keeps the 1-D one's numbers), written after each slice, so that a call killed in its 2-D slice
keeps its 1-D one; then the figures, from those files (figures.py): slice_1d, slice_2d and
surface_2d (.png, or ``plots.format``). A slice that landscape.json holds with this call's
settings, computed after the checkpoint was written, is kept, not computed again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from omegaconf import OmegaConf

from ..rundir import CHECKPOINT
from ..runfiles import read_json
from .directions import filter_normalized, hessian_directions, norm, weight_norm
from .evaluate import COLUMNS, Evaluator
from .figures import draw_slices
from .files import SUMMARY, clean, folder, update_summary, write_npz, write_rows
from .geometry import grid, index_of, line_summary

if TYPE_CHECKING:
    import torch

    from ..rebuild import LoadedRun
    from .options import Options


def train_samples(run: LoadedRun, opt: Options) -> int:
    """landscape.train_samples, else the run's curvature subset size
    (metrics.hessian.num_samples)."""
    if opt.train_samples is not None:
        return int(opt.train_samples)
    return int(OmegaConf.select(run.cfg, "metrics.hessian.num_samples", default=4096))


def make_evaluator(run: LoadedRun, opt: Options) -> Evaluator:
    """The evaluator of ``run`` at the subset sizes and BatchNorm handling ``opt`` asks for."""
    return Evaluator(run, train_samples(run, opt), opt.batch_size, opt.bn, opt.bn_samples)


def _hessian_options(run) -> dict:
    h = OmegaConf.select(run.cfg, "metrics.hessian", default=None) or {}
    return {
        "tol": float(h.get("tol", 1e-3)),
        "max_iter": int(h.get("max_iter", 100)),
        "method": str(h.get("method", "auto")),
        "graph_cache_mb": float(h.get("graph_cache_mb", 1024)),
        "batch_size": int(h.get("batch_size", 1024)),
    }


def make_directions(run: LoadedRun, ev: Evaluator, opt: Options, k: int) -> tuple[list, list]:
    """k directions and a description of each (kind, seed, norm; eigenvalue for Hessian ones)."""
    scale = weight_norm(run.model, opt.include_bias_bn)
    if opt.directions == "random":
        dirs = [filter_normalized(run.model, opt.seed + i, opt.include_bias_bn) for i in range(k)]
        info = [{"kind": "filter-normalized random", "seed": opt.seed + i} for i in range(k)]
    else:
        h = _hessian_options(run)
        x, y = ev.subset
        step = h["batch_size"]
        batches = [(x[i : i + step], y[i : i + step]) for i in range(0, len(y), step)]
        criterion = ev.criterion
        dirs, values, lz = hessian_directions(
            run.model, lambda out, t: criterion(out.float(), t), batches, k, opt.seed, h, scale
        )
        info = [
            {
                "kind": f"Hessian eigenvector {i + 1}",
                "eigenvalue": v,
                "lanczos_seed": opt.seed,
                **lz,
            }
            for i, v in enumerate(values)
        ]
    for d, i in zip(dirs, info):
        i["norm"] = norm(d)
    return dirs, info


def _summary(coords, values, info: dict, radius: float) -> dict:
    """Curvature and basin width of the train loss along one line, and κ per unit ‖d‖²."""
    s = line_summary(coords, values, radius)
    k, n = s["curvature"], info["norm"]
    s["curvature_per_unit_norm"] = k / n**2 if k is not None and n > 0 else None
    return s


def _centre(values_at_centre) -> dict:
    return {name: float(v) for name, v in zip(COLUMNS, values_at_centre)}


def slice_1d(
    run: LoadedRun, ev: Evaluator, opt: Options, d: list[torch.Tensor], info: dict
) -> dict:
    """The 1-D slice along ``d``: its CSV, and its part of landscape.json."""
    x = grid(*opt.span, opt.points)
    values = ev.sweep(x, lambda c: ev.move([d], [c]), "1-D slice", opt.progress)
    write_rows(folder(run.path, run.weights) / "slice_1d.csv", "coordinate", x, values)
    s = _summary(x, values[:, 0], info, opt.fit_radius)
    centre = _centre(values[index_of(x, 0.0)])
    settings = opt.slice_settings("1d", train_samples=ev.sizes["train_samples"])
    return {
        **centre,
        "basin_width_1d": s["basin_width"],
        "basin_clipped_1d": s["basin_clipped"],
        "curvature_1d": s["curvature"],
        "curvature_1d_per_unit_norm": s["curvature_per_unit_norm"],
        "slice_1d": {"settings": settings, "direction": info, **s, "centre": centre},
    }


def slice_2d(
    run: LoadedRun, ev: Evaluator, opt: Options, dirs: list[list[torch.Tensor]], infos: list[dict]
) -> dict:
    """The 2-D slice along ``dirs``: its arrays, and its part of landscape.json."""
    xs = ys = grid(*opt.span, opt.grid)
    points = [(a, b) for b in ys for a in xs]  # row-major: values[iy, ix]
    flat = ev.sweep(points, lambda p: ev.move(dirs, p), "2-D slice", opt.progress)
    values = flat.reshape(len(ys), len(xs), len(COLUMNS))
    seeds = [i.get("seed", i.get("lanczos_seed")) for i in infos]
    write_npz(
        folder(run.path, run.weights) / "slice_2d.npz",
        x=xs,
        y=ys,
        **{name: values[:, :, k] for k, name in enumerate(COLUMNS)},
        seeds=np.asarray(seeds),
        directions=np.asarray([i["kind"] for i in infos]),
    )
    ix, iy = index_of(xs, 0.0), index_of(ys, 0.0)
    lines = [_summary(xs, values[iy, :, 0], infos[0], opt.fit_radius)]
    lines.append(_summary(ys, values[:, ix, 0], infos[1], opt.fit_radius))
    settings = opt.slice_settings("2d", train_samples=ev.sizes["train_samples"])
    return {
        **_centre(values[iy, ix]),
        "basin_width_2d": [s["basin_width"] for s in lines],
        "curvature_2d": [s["curvature"] for s in lines],
        "slice_2d": {"settings": settings, "directions": infos, "axes": lines},
    }


DATA_FILES = {"1d": "slice_1d.csv", "2d": "slice_2d.npz"}


def kept(run: LoadedRun, opt: Options, held: dict, dim: str, n: int) -> bool:
    """Whether landscape.json holds the ``dim`` slice with this call's settings, its data file
    is there, and both are newer than the checkpoint (a run trained again is sliced again)."""
    out = folder(run.path, run.weights)
    part = held.get(f"slice_{dim}") or {}
    if part.get("settings") != clean(opt.slice_settings(dim, train_samples=n)):
        return False
    try:
        since = (run.path / CHECKPOINT).stat().st_mtime_ns
        files = (out / DATA_FILES[dim], out / SUMMARY)
        return all(f.stat().st_mtime_ns >= since for f in files)
    except OSError:
        return False


def run_slices(run: LoadedRun, opt: Options) -> dict:
    """The slices ``opt.slices`` asks for, then landscape.json; returns what it now holds.
    One sam-landscape at a time per run (its lock); a second one is refused in one line."""
    from ..lock import job_lock
    from .files import require_writable

    require_writable(run.path, run.weights)
    with job_lock(run.path, "landscape", "fail", "sam-landscape"):
        return _run_slices(run, opt)


def _run_slices(run, opt) -> dict:
    out = folder(run.path, run.weights)
    ev = make_evaluator(run, opt)
    held, n = read_json(out / SUMMARY) or {}, ev.sizes["train_samples"]
    asked = [dim for dim in ("1d", "2d") if opt.slices in (dim, "both")]
    todo = [dim for dim in asked if not kept(run, opt, held, dim, n)]
    for dim in (d for d in asked if d not in todo):
        _note(opt, f"the {dim[0]}-D slice is in landscape.json with these settings: kept")
    fresh = {**run.describe(), **ev.sizes}
    if todo:  # one set of directions: the 1-D slice runs along the 2-D plane's first axis
        dirs, infos = make_directions(run, ev, opt, 2 if "2d" in todo else 1)
    if "1d" in todo:
        fresh.update(slice_1d(run, ev, opt, dirs[0], infos[0]))
        if "2d" in todo:  # a call killed in the 2-D slice keeps this one (no options: not done)
            update_summary(out, fresh, replace=("options",))
    if "2d" in todo:
        fresh.update(slice_2d(run, ev, opt, dirs, infos))
    summary = update_summary(out, {**fresh, "options": opt.slice_options()})
    draw_slices(out, opt.plot_format, opt.slices)
    return summary


def _note(opt, text: str) -> None:
    import sys

    from ..progress import resolve_mode

    if resolve_mode(opt.progress) != "none":
        print(f"sam-landscape: {text}", file=sys.stderr, flush=True)
