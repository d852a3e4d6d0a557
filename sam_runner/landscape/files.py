"""The files sam-landscape writes, each atomically (runfiles.atomic_write): a kill leaves the
old file or the new one, never half of one; landscape.json is written last. Torch-free; the folder's
names are rundir.py's."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..rundir import LANDSCAPE_FOLDERS as FOLDERS
from ..rundir import LANDSCAPE_SUMMARY as SUMMARY
from ..runfiles import atomic_write, atomic_write_bytes, read_json, write_json

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    import numpy as np

    from .options import Options

FOLDER = FOLDERS["last"]  # the last weights'; the averaged weights': FOLDERS["averaged"]
COLUMNS = ("train_loss", "test_loss", "train_acc", "test_acc")  # the values at each point


def require_writable(run_dir: Path, weights: str = "last") -> None:
    """The run's landscape folder can be written: checked before any point is computed."""
    import os

    from ..errors import UserError

    target = Path(run_dir) / FOLDERS.get(weights, FOLDER)
    probe = target / f".write_probe{os.getpid()}"
    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
        if created:  # a refusal later must leave no folder behind
            target.rmdir()
    except OSError as e:
        raise UserError(
            f"{target} cannot be written ({e.strerror or e}); sam-landscape writes its files "
            "there: make the run folder writable, or measure a writable copy of it"
        ) from None


def clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats as null, numpy scalars and tuples as plain values."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_rows(
    path: Path, first: str, coords: Sequence | np.ndarray, values: Sequence | np.ndarray
) -> None:
    """A CSV: the coordinate, then COLUMNS; floats written exactly (repr)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([first, *COLUMNS])
    for c, row in zip(coords, values):
        w.writerow([repr(float(c)), *(repr(float(v)) for v in row)])
    atomic_write_bytes(path, buf.getvalue().encode())


def read_columns(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A CSV of ``write_rows``: (its coordinates, its values [rows, len(COLUMNS)]) as float64
    arrays, exactly as written."""
    import numpy as np

    with open(path, newline="") as f:
        table = [[float(v) for v in row] for row in list(csv.reader(f))[1:]]
    data = np.asarray(table, dtype=float).reshape(-1, 1 + len(COLUMNS))
    return data[:, 0], data[:, 1:]


def write_npz(path: Path, **arrays: Any) -> None:
    """The arrays in one .npz file, written atomically."""
    import numpy as np

    atomic_write(path, lambda f: np.savez(f, **arrays))


def update_summary(folder: Path, fresh: dict, replace: Iterable[str] = ()) -> dict:
    """landscape.json of ``folder``: what it held, less the keys in ``replace``, plus ``fresh``."""
    path = Path(folder) / SUMMARY
    old = read_json(path) or {}
    merged = {k: v for k, v in old.items() if k not in replace}
    merged.update(clean(fresh))
    write_json(path, merged)
    return merged


def replace_summary(folder: Path, fresh: dict) -> dict:
    """landscape.json of ``folder``: ``fresh`` alone (a pair's file describes one computation)."""
    summary = clean(fresh)
    write_json(Path(folder) / SUMMARY, summary)
    return summary


def folder(run: Path, weights: str = "last") -> Path:
    """RUN/landscape (the last weights) or RUN/landscape_averaged (the averaged weights)."""
    return Path(run) / FOLDERS[weights]


def pair_folder(run_a: Path, run_b: Path, weights: str = "last") -> Path:
    """RUN_A/landscape/<RUN_B's folder name> (characters other than letters, digits, ``._=-,+``
    replaced by ``_``)."""
    name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", Path(run_b).name) or "run_b"
    return folder(run_a, weights) / name


def newer_than_weights(summary: Path, *runs: Path) -> bool:
    """Whether ``summary`` was written after each run's checkpoint (a run trained again since is
    measured again)."""
    from ..rundir import CHECKPOINT

    try:
        written = summary.stat().st_mtime_ns
        return all((Path(r) / CHECKPOINT).stat().st_mtime_ns <= written for r in runs)
    except OSError:
        return False


def slices_done(job: Path, opt: Options) -> bool:
    """Whether the job's landscape.json holds the slices of these options, newer than its
    weights."""
    summary = folder(job, opt.weights) / SUMMARY
    held = read_json(summary) or {}
    return held.get("options") == clean(opt.slice_options()) and newer_than_weights(summary, job)


def connectivity_done(run_a_dir: Path, run_b_dir: Path, opt: Options) -> bool:
    """Whether RUN_A/landscape/<B> holds the connectivity to this run B with these options,
    newer than both runs' weights."""
    summary = pair_folder(run_a_dir, run_b_dir, opt.weights) / SUMMARY
    held = read_json(summary) or {}
    same_b = (held.get("run_b") or {}).get("run") == str(Path(run_b_dir).resolve())
    same = same_b and held.get("options") == clean(opt.pair_settings())
    return same and newer_than_weights(summary, run_a_dir, run_b_dir)
