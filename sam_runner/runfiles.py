"""The files every run leaves: metrics.jsonl, summary.json, checkpoints/last.pt.

Everything is written atomically (a temporary file, then a rename): a kill at any
moment leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import RunFolderConflict, UserError

CHECKPOINT = Path("checkpoints") / "last.pt"

# How a run runs, not what it computes: left out when two runs are compared (a resume on
# another device, with another logger or data folder is the same run). The sweep rule adds
# hydra.job.config.override_dirname.exclude_keys (conf/config.yaml) to these.
RUN_ONLY_KEYS = ("hydra", "trainer.device", "trainer.progress", "trainer.compile", "trainer.channels_last",
                 "logger", "dataset.data_dir", "dataset.download")


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


def run_only(key: str, exclude=RUN_ONLY_KEYS) -> bool:
    """Whether a config key or override key (``logger.project``, ``hydra/launcher``) is a how-it-runs key."""
    key = key.lstrip("+~")
    return any(key == k or key.startswith((k + ".", k + "/")) for k in exclude)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def result_config(cfg) -> dict:
    """What a run's results depend on: the resolved config as dotted keys, how-it-runs keys left out."""
    from omegaconf import OmegaConf
    tree = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    return {k: v for k, v in _flatten(tree).items() if not run_only(k)}


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def describe_changes(changes: list[str], limit: int = 3) -> str:
    return ", ".join(changes[:limit]) + (f" and {len(changes) - limit} more" if len(changes) > limit else "")


def require_same_config(saved: dict | None, now: dict, what: str, run_dir) -> None:
    """RunFolderConflict naming the keys (old -> new) whose values differ between a stored result
    config and this run's. A run stored before configs were (``saved`` None) matches; so do keys
    only one side has: options a newer or older version added or dropped, not another run."""
    if not saved:
        return
    changes = [f"{k} {_show(saved[k])} -> {_show(v)}" for k, v in now.items() if k in saved and saved[k] != v]
    if changes:
        raise RunFolderConflict(f"{what} belongs to a different run ({describe_changes(changes)}); use another "
                                f"run folder, or delete {run_dir} to start over")


def holds_results(run_dir) -> bool:
    """Whether running in ``run_dir`` would continue a run there: a checkpoint to resume, or a completed summary."""
    run_dir = Path(run_dir)
    summary = read_json(run_dir / "summary.json") or {}
    return (run_dir / CHECKPOINT).exists() or summary.get("status") == "completed"


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
