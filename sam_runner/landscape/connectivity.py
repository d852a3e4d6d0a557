"""Between two runs: the loss along θ(α) = (1 − α)·θ_A + α·θ_B, its barrier, and optionally a
trained quadratic Bézier curve (bezier.py).

Frankle et al. (2020): evaluating the straight line between two networks and the rise of the
error along it. The barrier here subtracts the straight line between the two end values
(geometry.py) instead of their mean; the two agree at α = ½. Every floating-point tensor of
the two state dicts is interpolated, BatchNorm statistics included (our default); with
``landscape.bn=recompute`` the statistics are reset at each α on training data (Jordan et al. 2023).
The training subset is run A's curvature subset, and the test set the runs' own.

Writes into RUN_A/landscape/<RUN_B's folder name>/: connectivity.csv (alpha, then the four
columns), bezier.csv with ``landscape.curve=bezier`` (t, then the four columns; removed by a
call without a curve), landscape.json (the settings, both runs, the end values and the
barriers; written whole: the folder describes its last computation alone), then
connectivity.png (or ``plots.format``), drawn from those files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import UserError
from ..runfiles import read_json
from .evaluate import COLUMNS, Evaluator
from .figures import draw_pair
from .files import SUMMARY, pair_folder, replace_summary, write_rows
from .geometry import barrier, grid
from .slices import make_evaluator

if TYPE_CHECKING:
    from ..rebuild import LoadedRun
    from .options import Options


def _structure(run) -> list:
    return [(k, tuple(v.shape)) for k, v in run.model.state_dict().items()]


def check_same_architecture(a: LoadedRun, b: LoadedRun) -> None:
    """A one-line error unless the two runs' models have the same tensors (names and shapes) on
    the same data."""
    what = (
        f"run {a.path.name} has model {a.cfg.model.arch} and run {b.path.name} {b.cfg.model.arch}"
    )
    if str(a.cfg.dataset.name) != str(b.cfg.dataset.name):
        raise UserError(
            f"run {a.path.name} was trained on dataset {a.cfg.dataset.name} and run "
            f"{b.path.name} on {b.cfg.dataset.name}; landscape.to needs two runs of one model "
            "on one dataset"
        )
    sa, sb = _structure(a), _structure(b)
    if sa != sb:
        diff = next(
            (f"{x[0]} {list(x[1])} vs {y[0]} {list(y[1])}" for x, y in zip(sa, sb) if x != y),
            f"{len(sa)} vs {len(sb)} tensors",
        )
        raise UserError(
            f"runs of different architectures ({what}; {diff}); landscape.to needs two runs of "
            "the same architecture"
        )


def alpha_grid(opt: Options) -> np.ndarray:
    """``opt.alphas`` points over ``opt.alpha_range``, holding 0, ½ and 1 exactly."""
    return grid(*opt.alpha_range, opt.alphas, must=(0.0, 0.5, 1.0))


def barriers(alphas: np.ndarray, values: np.ndarray) -> dict:
    """The barrier of the train and test loss and of the train and test error (1 − accuracy),
    with the α where each is highest."""
    out = {}
    for k, name in enumerate(COLUMNS):
        series = values[:, k] if name.endswith("loss") else 1 - values[:, k]
        key = name.replace("acc", "error")
        b = barrier(alphas, series)
        out[f"barrier_{key}"], out[f"barrier_{key}_alpha"] = b["barrier"], b["alpha"]
    return out


def line(ev: Evaluator, a: dict, b: dict, alphas: np.ndarray, progress: str) -> np.ndarray:
    """The values along the straight line from state dict ``a`` to ``b``."""
    sa, sb = ev.state_list(a), ev.state_list(b)
    return ev.sweep(alphas, lambda al: ev.mix(sa, sb, al), "A → B", progress)


def _ends(alphas, values) -> dict:
    a = np.asarray(alphas)
    at = {"a": values[int(np.flatnonzero(a == 0)[0])], "b": values[int(np.flatnonzero(a == 1)[0])]}
    return {side: {n: float(v) for n, v in zip(COLUMNS, row)} for side, row in at.items()}


def connect(run_a: LoadedRun, run_b: LoadedRun, opt: Options) -> dict:
    """The connectivity of two loaded runs: its files and its landscape.json (returned)."""
    check_same_architecture(run_a, run_b)
    out = pair_folder(run_a.path, run_b.path, run_a.weights)
    held = (read_json(out / SUMMARY) or {}).get("run_b") or {}
    if held.get("run") not in (None, str(run_b.path)):
        raise UserError(
            f"{out} holds the connectivity to another run B ({held['run']}); move it away to "
            f"connect {run_b.path}"
        )
    ev = make_evaluator(run_a, opt)
    alphas = alpha_grid(opt)
    values = line(ev, run_a.state, run_b.state, alphas, opt.progress)
    summary = {
        "run_a": run_a.describe(),
        "run_b": run_b.describe(),
        "options": opt.pair_settings(),  # as given: what a resume compares
        "settings": pair_settings(run_a, ev, opt),
        **ev.sizes,
        **barriers(alphas, values),
        "ends": _ends(alphas, values),
    }
    if opt.curve == "bezier":
        from .bezier import bezier_curve

        ts, curve_values, curve_summary = bezier_curve(run_a, run_b, ev, opt, alphas, values)
        write_rows(out / "bezier.csv", "t", ts, curve_values)
        summary["curve"] = curve_summary
    else:  # a curve of earlier options would describe another computation
        (out / "bezier.csv").unlink(missing_ok=True)
    write_rows(out / "connectivity.csv", "alpha", alphas, values)
    # the folder describes this computation alone: nothing of an earlier call is kept
    summary = replace_summary(out, summary)
    draw_pair(out, opt.plot_format)
    return summary


def pair_settings(run_a: LoadedRun, ev: Evaluator, opt: Options) -> dict:
    """The options a pair's connectivity was computed with (what a later call compares)."""
    epochs = None
    if opt.curve == "bezier":
        epochs = opt.curve_epochs or int(run_a.cfg.trainer.epochs)
    return opt.pair_settings(train_samples=ev.sizes["train_samples"], curve_epochs=epochs)
