"""The files every run leaves: metrics.jsonl, summary.json, checkpoints/last.pt.

Everything is written atomically (a temporary file, flushed to disk, then a rename): a kill
at any moment leaves either the old file or the new one, never half of one. Nothing here
imports torch at module level: ``sam-report`` and the plots read run files without it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from . import interrupts
from .errors import UserError, first_line

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

# 1: counters and logger id at the top level (before the run's parts had names)
CHECKPOINT_FORMAT = 2


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """``write(file)`` into a temporary file beside ``path``, fsync, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with interrupts.deferred():  # a signal waits for the file: whole, then raised
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path``, written atomically."""
    atomic_write(path, lambda f: f.write(data))


def writable(folder: Path) -> bool:
    """A file can be created in `folder` (per process: data-parallel ranks probe the same one)."""
    probe = Path(folder) / f".write_probe{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


def finite(v: object) -> bool:
    """A real number that is neither NaN nor infinite (bools are not numbers here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (float("inf") if v > 0 else float("-inf"))
    return v


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as indented JSON, written atomically."""
    atomic_write_bytes(
        path, (json.dumps({k: _jsonable(v) for k, v in obj.items()}, indent=2) + "\n").encode()
    )


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None when it is missing or unreadable (``json_problem``
    says which)."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def json_problem(path: Path) -> str | None:
    """What is wrong with a JSON object file that ``read_json`` could not read: ``missing``,
    ``corrupt (...)`` naming why, or None when it reads as an object."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or type(e).__name__})"
    try:
        obj = json.loads(text)
    except ValueError as e:
        return (
            f"corrupt (not JSON: {first_line(str(e)) or 'empty'})"
            if text.strip()
            else ("corrupt (empty)")
        )
    return None if isinstance(obj, dict) else "corrupt (not a JSON object)"


def read_rows(path: Path) -> list[dict]:
    """metrics.jsonl rows; a line cut by a kill ends the list (it and anything after it are not
    trusted)."""
    return scan_rows(path)[0]


def scan_rows(path: Path) -> tuple[list[dict], str | None, bool]:
    """(``read_rows``'s rows, what ended them early or None: ``unreadable (why)`` or ``line N is
    not a JSON object``, whether that line was the last); a missing file has no rows, no fault."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return [], None, False
    except (OSError, UnicodeDecodeError) as e:
        return [], f"unreadable ({getattr(e, 'strerror', None) or type(e).__name__})", False
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            return rows, f"line {number} is not a JSON object", number == len(lines)
        rows.append(row)
    return rows, None, False


class MetricsLog:
    """metrics.jsonl: one JSON object per line. On resume, lines past the checkpoint are dropped."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def rows(self) -> list[dict]:
        """The file's rows."""
        return read_rows(self.path)

    def truncate_after(self, step: int) -> None:
        """Keep only lines up to optimizer step ``step`` (the checkpoint's), so no epoch repeats."""
        keep = [r for r in self.rows() if r.get("step", 0) <= step]
        atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in keep).encode())

    def append(self, row: dict) -> None:
        """Append one row as a JSON line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
            f.flush()


class Checkpoint:
    """checkpoints/last.pt: the state of each of a run's parts under the part's name, its
    fingerprint and the format number."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def save(self, state: dict) -> None:
        """The parts' state, with the format number, written atomically."""
        import torch

        atomic_write(self.path, lambda f: torch.save({"format": CHECKPOINT_FORMAT, **state}, f))

    def load(self, assemble: bool = True) -> dict | None:
        """The checkpoint's state in the current format (None when there is none); a one-line
        error for an unreadable file or one that is not a sam-run checkpoint. A sharded run's
        ``last.pt`` points at its shards (``sharded``): with ``assemble`` the whole model's state
        is read from them once (rank 0's own state beside it, its optimizer shards left out), else
        the pointer as it is."""
        if not self.path.exists():
            return None
        import torch

        try:
            # weights_only: a checkpoint is data, never code
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UserError(
                f"checkpoint {self.path} is unreadable ({type(e).__name__}); it may be truncated "
                "or corrupt: restore it, or delete it to start the run over"
            ) from None
        if (
            not isinstance(state, dict)
            or "model" not in state
            or not ("step" in state or "clock" in state)
        ):
            raise UserError(
                f"checkpoint {self.path} is not a sam-run checkpoint; delete it to start the run "
                "over"
            )
        state = upgrade(state)
        if assemble and state.get("sharded"):
            state = self._assembled(state)
        return state

    def _assembled(self, pointer: dict) -> dict:
        import torch

        folder = self.path.parent / str(pointer["sharded"])
        try:
            own = torch.load(folder / "rank0.pt", map_location="cpu", weights_only=True)
            model = assembled(folder)
        except Exception as e:
            raise UserError(
                f"sharded checkpoint {folder} (named by {self.path}) is unreadable "
                f"({type(e).__name__}); restore it, or delete {self.path} to start the run over"
            ) from None
        own.pop("optimizer", None)  # rank 0's shards of it only
        return {**own, **pointer, "model": model}


def assembled(folder: Path) -> dict:
    """The whole model's state dict of a sharded checkpoint (``torch.distributed.checkpoint``),
    assembled once in this process, no process group needed: what sam-eval, sam-landscape and
    model.init_from read of a run trained with trainer.strategy=fsdp."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        full = _load_state_dict_from_keys(checkpoint_id=str(folder))
    return dict(full.get("model", full))


def upgrade(state: dict) -> dict:
    """A checkpoint in the current format: format 1 kept its counters and logger id at the top
    level.
    """
    if state.get("format", 1) == 1:
        state = dict(state)
        state["clock"] = {k: state.pop(k) for k in ("epoch", "step", "elapsed", "train_time")}
        state["logger"] = {"run_id": state.pop("logger_run_id", None)}
        state["format"] = CHECKPOINT_FORMAT
    return state


class InitialWeights:
    """checkpoints/init.pt: the model's state_dict at step 0 (``dist_from_init``), written once
    when a run starts fresh; absent in run folders from before it existed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def save(self, state_dict: dict) -> None:
        """The model's initial state dict, written atomically."""
        import torch

        weights = {k: v.detach().cpu() for k, v in state_dict.items()}
        atomic_write(self.path, lambda f: torch.save(weights, f))

    def load(self) -> dict | None:
        """The weights, or None when the file is absent or unreadable (the measure is then left
        out: nothing else depends on it)."""
        if not self.path.is_file():
            return None
        import torch

        try:
            return torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception:
            return None
