"""``dataset=arrays``: the user's own labelled arrays (spectra, other 1-D signals, small images).

``dataset.path`` is one of
- an ``.npz`` file with ``x`` and ``y`` (optionally ``x_test`` and ``y_test``);
- a folder with ``x.npy`` and ``y.npy`` (optionally ``x_test.npy`` and ``y_test.npy``);
- a ``.csv`` file, one row a sample, a header row, the label in ``dataset.label_column``;
- ``synthetic_spectra``: the stand-in spectra of ``spectra()``, made in memory.
Rows of ``x`` shaped ``[L]`` are 1-D signals of one channel, ``[C, L]`` signals of C channels,
``[H, W]`` or ``[C, H, W]`` images. Labels of any kind are mapped to 0..C-1 in sorted order.
Without a test set, a seeded ``dataset.test_fraction`` of the samples is held out (fixed by
``dataset.split_seed``, not the run's seed: every seed sees one test set). Every feature is
standardised with the mean and standard deviation of the training split.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import UserError, first_line, number, require
from ..registry import DATASETS
from . import Arrays

if TYPE_CHECKING:
    from omegaconf import DictConfig

SYNTHETIC = "synthetic_spectra"  # dataset.path: the stand-in spectra of ``spectra()``
_LOADED: dict = {}  # (path, mtime, label column) -> the raw arrays: the checks' read, reused


def _read_csv(path: Path, column: str):
    import csv

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    require(len(rows) > 1, f"dataset.path={path}: no rows under the header")
    header = [h.strip() for h in rows[0]]
    require(
        column in header,
        f"dataset.label_column={column!r} is not a column of {path}; its columns are "
        f"{', '.join(header[:10])}{' ...' if len(header) > 10 else ''}",
    )
    at = header.index(column)
    try:
        x = np.array([[float(v) for i, v in enumerate(r) if i != at] for r in rows[1:]])
    except ValueError as e:
        raise UserError(f"dataset.path={path}: a feature is not a number ({e})") from None
    return {"x": x, "y": np.array([r[at].strip() for r in rows[1:]])}


def _read(cfg) -> dict:
    path = cfg.get("path")
    require(
        path not in (None, "", "???"),
        "dataset=arrays needs dataset.path=<an .npz file, a folder with x.npy and y.npy, or a "
        ".csv file>",
    )
    if str(path) == SYNTHETIC:  # the stand-in spectra, made in memory (seeded: always the same)
        return dict(zip(("x", "y"), spectra()))
    p = Path(str(path)).expanduser()
    require(p.exists(), f"dataset.path={path} does not exist")
    column = str(cfg.get("label_column", "label"))
    key = (str(p), p.stat().st_mtime_ns, column)
    if key in _LOADED:
        return _LOADED[key]
    if p.is_dir():
        require(
            (p / "x.npy").is_file() and (p / "y.npy").is_file(),
            f"dataset.path={path}: a folder of arrays holds x.npy and y.npy",
        )
        names = [n for n in ("x", "y", "x_test", "y_test") if (p / f"{n}.npy").is_file()]
        d = {n: _load_npy(p / f"{n}.npy", path) for n in names}
    elif p.suffix == ".npz":
        try:
            with np.load(p, allow_pickle=False) as z:
                require("x" in z and "y" in z, f"dataset.path={path} has no arrays named x and y")
                d = {n: z[n] for n in ("x", "y", "x_test", "y_test") if n in z}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(_unreadable(path, "an .npz file", e)) from None
    elif p.suffix == ".csv":
        d = _read_csv(p, column)
    else:
        raise UserError(f"dataset.path={path}: give an .npz file, a folder of .npy files or a .csv")
    _check(d, str(path))
    _LOADED[key] = d
    return d


def _check(d: dict, path: str) -> None:
    for xs, ys in (("x", "y"), ("x_test", "y_test")):
        if (xs in d) != (ys in d):
            raise UserError(f"dataset.path={path}: {xs} and {ys} come together")
        if xs not in d:
            continue
        x, y = d[xs], d[ys]
        require(
            len(x) == len(y),
            f"dataset.path={path}: {xs} has {len(x)} samples and {ys} {len(y)}; one label a sample",
        )
        require(x.ndim in (2, 3, 4), f"dataset.path={path}: {xs} has shape {x.shape}")
        require(
            np.issubdtype(x.dtype, np.number) and bool(np.isfinite(x).all()),
            f"dataset.path={path}: {xs} holds NaN, infinite or non-numeric values",
        )
    classes = np.unique(d["y"])
    require(
        len(classes) >= 2,
        f"dataset.path={path}: y has a single class ({classes[0]!r}); a classifier needs two",
    )


def _load_npy(file: Path, path) -> np.ndarray:
    try:
        return np.load(file, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise UserError(_unreadable(f"{path} ({file.name})", "a .npy file", e)) from None


def _unreadable(path, what: str, e: Exception) -> str:
    """numpy's refusal of a file that is not what its name says (a text file named .npz reads as
    pickled data, which is never loaded), in one line."""
    why = first_line(str(e)) or type(e).__name__
    if "pickled" in why:  # numpy's reading of any file without its header
        why = "numpy reads it as pickled Python objects, which are never loaded"
    return (
        f"dataset.path={path} cannot be read as {what} ({why}); give arrays written by "
        "numpy.savez or numpy.save (numbers, no Python objects), or a .csv"
    )


def _as_input(x: np.ndarray) -> torch.Tensor:
    t = torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32)
    return t[:, None] if t.dim() == 2 else t


def arrays_shape(cfg: DictConfig) -> tuple[tuple, int]:
    """(input shape, class count) of the ``arrays`` dataset's file."""
    d = _read(cfg)
    return tuple(_as_input(d["x"][:1]).shape[1:]), len(np.unique(d["y"]))


def _test_fraction(cfg) -> float:
    return number(
        "dataset.test_fraction",
        cfg.get("test_fraction", 0.2),
        "a fraction in (0, 1) (held out as the test set when the arrays have none)",
        lambda f: 0 < f < 1,
    )


@DATASETS.register(
    "arrays",
    "your own labelled arrays (.npz, x.npy/y.npy, .csv): spectra, signals, small images",
    check=lambda cfg: (_test_fraction(cfg), _read(cfg)),
    input_shape=None,
    num_classes=None,
    shape_of=arrays_shape,
)
def arrays(cfg: DictConfig) -> Arrays:
    """The ``arrays`` dataset: your arrays standardised by the training set's statistics; their
    own test split, or ``test_fraction`` held out."""
    d = _read(cfg)
    classes = np.unique(np.concatenate([d["y"], d.get("y_test", d["y"][:0])]))
    label = lambda y: torch.as_tensor(np.searchsorted(classes, y), dtype=torch.long)
    x, y = _as_input(d["x"]), label(d["y"])
    if "x_test" in d:
        xt, yt = _as_input(d["x_test"]), label(d["y_test"])
    else:
        g = torch.Generator().manual_seed(int(cfg.get("split_seed", 0)) + 15485863)
        order = torch.randperm(len(y), generator=g)
        cut = len(y) - max(1, int(round(len(y) * _test_fraction(cfg))))
        (x, xt), (y, yt) = (x[order[:cut]], x[order[cut:]]), (y[order[:cut]], y[order[cut:]])
    mean, std = x.mean(0, keepdim=True), x.std(0, keepdim=True).clamp_min(1e-8)
    return Arrays((x - mean) / std, y, (xt - mean) / std, yt, len(classes))


def synthetic_spectra(
    path: Path | str, n: int = 600, length: int = 200, classes: int = 3, seed: int = 0
) -> Path:
    """Writes ``spectra()`` as an .npz file (x, y) at ``path``."""
    x, y = spectra(n, length, classes, seed)
    np.savez(path, x=x, y=y)
    return Path(path)


def spectra(
    n: int = 600, length: int = 200, classes: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic spectra (x [n, length], y [n]): per class two Gaussian peaks at class-dependent
    positions, a random sloped baseline, and noise (a stand-in for Raman spectra)."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 1, length)
    y = rng.integers(0, classes, n)
    centres = np.linspace(0.2, 0.8, classes + 1)
    x = np.empty((n, length))
    for i, c in enumerate(y):
        peaks = sum(
            rng.uniform(0.6, 1.0) * np.exp(-((grid - m - rng.normal(0, 0.01)) ** 2) / 2e-4)
            for m in (centres[c], centres[c + 1] - 0.05)
        )
        base = rng.uniform(0, 0.5) + rng.uniform(-0.3, 0.3) * grid
        x[i] = peaks + base + rng.normal(0, 0.05, length)
    return x.astype(np.float32), y
