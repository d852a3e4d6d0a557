"""The files every run leaves: metrics.jsonl, summary.json, checkpoints/last.pt.

Everything is written atomically (a temporary file, then a rename): a kill at any
moment leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import UserError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (float("inf") if v > 0 else float("-inf"))
    return v


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps({k: _jsonable(v) for k, v in obj.items()}, indent=2) + "\n").encode())


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_rows(path: Path) -> list[dict]:
    """metrics.jsonl rows; a line cut by a kill ends the list (it and anything after it are not trusted)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            break
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows


class MetricsLog:
    """metrics.jsonl: one JSON object per line. On resume, lines past the checkpoint are dropped."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def rows(self) -> list[dict]:
        return read_rows(self.path)

    def truncate_after(self, step: int) -> None:
        """Keep only lines up to optimizer step ``step`` (the checkpoint's), so no epoch repeats."""
        keep = [r for r in self.rows() if r.get("step", 0) <= step]
        atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in keep).encode())

    def append(self, row: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
            f.flush()


class Checkpoint:
    """checkpoints/last.pt: model, optimizer (variant and base), scheduler, scaler, RNG, counters."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def save(self, state: dict) -> None:
        import torch  # here, not at the top: report and plots read run files without torch
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, self.path)

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        import torch
        try:
            # weights_only: a checkpoint is data, never code
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UserError(f"checkpoint {self.path} is unreadable ({type(e).__name__}); it may be truncated "
                            "or corrupt: restore it, or delete it to start the run over") from None
        if not isinstance(state, dict) or "model" not in state or "step" not in state:
            raise UserError(f"checkpoint {self.path} is not a sam-run checkpoint; delete it to start the run over")
        return state
