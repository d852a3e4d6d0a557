"""The one reader of a run folder: everything any command needs from a job folder sam-run wrote.

``RunDir(path)`` reads, each lazily and once:

- ``overrides``: ``.hydra/overrides.yaml``, else summary.json's ``overrides``;
- ``config()``: the composed config as a plain nested dict: ``.hydra/config.yaml``, else (a
  run trained by ``train(cfg, dir)`` without Hydra) the settings summary.json records, else
  those its checkpoint records (every key a result depends on); ``omega_config()`` is it as an
  OmegaConf, with this environment's data folder where the run's does not exist here;
- ``summary``, ``status`` (``completed``, ``diverged``, ``pruned`` (a search stopped it),
  ``failed``; ``missing`` without a
  summary: running, killed or interrupted), ``rows()`` (metrics.jsonl);
- ``eval(weights)``, ``landscape(weights)``, ``pair_summaries(weights)``: what sam-eval and
  sam-landscape wrote (``weights="averaged"``: ``eval_averaged.json``, ``landscape_averaged/``);
- ``checkpoint()``: ``checkpoints/last.pt``, loaded weights-only (the model rebuilt from it, or
  from ``checkpoints/averaged.pt``: ``rebuild.py``).

The names of every file and folder of a run folder are this module's constants, and nothing else
in the package spells them. Importing it imports nothing heavy (no torch): sam-report and
sam-index read folders with it; ``checkpoint()`` imports torch.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError, require
from .runfiles import (
    Checkpoint,
    atomic_write_bytes,
    json_problem,
    read_json,
    read_rows,
    scan_rows,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    from omegaconf import DictConfig

# the names of a run folder's files and folders (nothing else in the package spells them)
SUMMARY = "summary.json"  # status, final values, overrides, settings: written last
METRICS = "metrics.jsonl"  # one line per evaluation (and per logged step)
HYDRA = ".hydra"  # Hydra writes it when a job starts
OVERRIDES = Path(HYDRA) / "overrides.yaml"
CONFIG = Path(HYDRA) / "config.yaml"
CHECKPOINTS = "checkpoints"
CHECKPOINT = Path(CHECKPOINTS) / "last.pt"
AVERAGED = Path(CHECKPOINTS) / "averaged.pt"
SHARDS = "last.shards-"  # checkpoints/last.shards-<step>/: a sharded run's checkpoint (fsdp)
INIT_WEIGHTS = Path(CHECKPOINTS) / "init.pt"  # the weights at step 0 (dist_from_init)
CLIENTS = "clients.json"  # a federated run's split: each client's size and class histogram
ADAPTER = "adapter"  # model.peft on model=hf: peft save_pretrained (PeftModel.from_pretrained)
CACHE = "cache"  # an image folder's decoded measurement subsets
WEIGHTS = ("last", "averaged")
STATUSES = ("completed", "diverged", "pruned", "failed")
EVAL_FILES = {"last": "eval.json", "averaged": "eval_averaged.json"}
LANDSCAPE_FOLDERS = {"last": "landscape", "averaged": "landscape_averaged"}
LANDSCAPE_SUMMARY = "landscape.json"  # in a landscape folder, and in each of its pair folders


def is_run(path: Path | str) -> bool:
    """Whether ``path`` is a job folder sam-run made: it holds ``.hydra/`` (a job under Hydra,
    from its start) or ``summary.json`` (a finished one, or a run of ``train(cfg, dir)``)."""
    path = Path(path)
    return (path / HYDRA).is_dir() or (path / SUMMARY).is_file()


def has_checkpoint(path: Path | str) -> bool:
    """Whether ``path`` holds a checkpoints folder: a run folder of ``train(cfg, dir)`` killed
    before its summary is one too, for the commands that rebuild a run's model."""
    return (Path(path) / CHECKPOINTS).exists()


def holds_results(run_dir: Path | str) -> bool:
    """Whether running in ``run_dir`` would continue a run there: a checkpoint to resume, or a
    completed summary."""
    run_dir = Path(run_dir)
    summary = read_json(run_dir / SUMMARY) or {}
    return (run_dir / CHECKPOINT).exists() or summary.get("status") == "completed"


def job_dirs(sweep_dir: Path | str) -> list[Path]:
    """Every job folder under a sweep: folders holding ``.hydra/`` (Hydra writes it when a job
    starts)
    or ``summary.json``, in natural order (``2`` before ``10``)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    dirs = set()
    # one walk (os.walk's scandir), not two rglob passes: a thousand job folders in a blink
    for parent, names, files in os.walk(sweep_dir, followlinks=True):  # as rglob did
        if HYDRA in names or SUMMARY in files:
            dirs.add(Path(parent))
        names[:] = [n for n in names if n != HYDRA]
    dirs.discard(sweep_dir)
    return sorted(
        dirs, key=lambda p: [int(s) if s.isdigit() else s for s in p.relative_to(sweep_dir).parts]
    )


# the top-level keys every sam-run config has: another program's Hydra jobs lack them
RUNNER_KEYS = ("trainer:", "optimizer:")


def made_by_sam_run(path: Path | str) -> bool:
    """Whether a job folder is sam-run's: its summary.json holds a status, it holds
    metrics.jsonl, or its ``.hydra/config.yaml`` sets ``trainer`` or ``optimizer`` (read as
    text: no YAML parse); another program's Hydra job has none of these. A job killed before
    Hydra wrote its config counts as sam-run's (nothing says otherwise)."""
    path = Path(path)
    summary = read_json(path / SUMMARY)
    if isinstance(summary, dict) and summary.get("status") is not None:
        return True
    if (path / METRICS).is_file():
        return True
    try:
        lines = (path / CONFIG).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return not (path / SUMMARY).is_file()  # a summary without a status: not sam-run's
    return any(x.startswith(RUNNER_KEYS) for x in lines)


def require_sam_run_jobs(
    path: Path, dirs: list[Path], what: str = "PATH", shown: Path | str | None = None
) -> None:
    """UserError when job folders were found under ``path`` and none is sam-run's (another
    program's sweep, or folders whose summary.json holds no status)."""
    if dirs and not any(made_by_sam_run(d) for d in dirs):
        names = ", ".join(str(d.relative_to(path)) if d != path else "." for d in dirs[:3])
        more = f" and {len(dirs) - 3} more" if len(dirs) > 3 else ""
        raise UserError(
            f"{what}={str(shown or path)!r} holds no job of sam-run: its job folder(s) {names}"
            f"{more} were written by another program (no summary.json status, and no trainer or "
            "optimizer in .hydra/config.yaml); pass a run folder or a sweep folder of sam-run"
        )


def check_weights(weights: str, spelling: str = "weights") -> str:
    """``weights`` when it names a known set of weights (``last``, ``averaged``), else a one-line
    error."""
    require(
        weights in WEIGHTS,
        f"{spelling}={weights!r} is unknown; choose one of {', '.join(WEIGHTS)}",
    )
    return weights


def eval_file(weights: str = "last") -> str:
    """The evaluation file of a run's ``weights``."""
    return EVAL_FILES[check_weights(weights)]


def landscape_folder(weights: str = "last") -> str:
    """The landscape folder of a run's ``weights``."""
    return LANDSCAPE_FOLDERS[check_weights(weights)]


def _read_yaml(path: Path):
    parsed = _PARSED.get()
    return parsed.read(path) if parsed is not None else _parse_yaml(path)


def _parse_yaml(path: Path):
    import yaml

    from .yaml_alike import load  # a sweep's configs differ in a few scalars: built alike

    try:
        return load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


class ParsedYaml:
    """The YAML files of run folders already parsed, kept as JSON in one file: a file whose
    size, mtime, ctime and inode are those it had when parsed is not parsed again (a thousand
    jobs' ``.hydra/config.yaml`` parse in seconds, their JSON in a blink). Values that JSON does
    not give back equal (dates, keys that are not strings, NaN) are parsed every time."""

    VERSION = 1

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        kept = read_json(self.path) or {}
        self._kept = kept.get("files") if kept.get("version") == self.VERSION else None
        self._kept = self._kept if isinstance(self._kept, dict) else {}
        self._read: dict[str, list] = {}  # what this run read: what the next one may reuse

    def read(self, path: Path) -> Any:
        """``path``'s YAML: the kept value while the file is unchanged, else parsed anew."""
        key = os.path.abspath(path)
        try:
            st = os.stat(path)  # before the read: a file changed meanwhile is parsed next time
        except OSError:
            return None
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        kept = self._kept.get(key)
        if isinstance(kept, list) and len(kept) == 5 and kept[:4] == stamp:
            self._read[key] = kept
            return json.loads(kept[4])  # kept as text: each read is the caller's own copy
        value = _parse_yaml(path)
        try:
            text = json.dumps(value, allow_nan=False)
            same = value is not None and json.loads(text) == value
        except (TypeError, ValueError):
            same = False
        if same:
            self._read[key] = [*stamp, text]
        return value

    def save(self) -> None:
        """Keep what this run read (atomically; nothing when it changed nothing, or the folder
        cannot be written: the files are parsed again next time)."""
        if self._read == self._kept:
            return
        data = json.dumps({"version": self.VERSION, "files": self._read}, separators=(",", ":"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.path, data.encode())
        except OSError:
            pass


_PARSED: ContextVar[ParsedYaml | None] = ContextVar("parsed_yaml", default=None)


@contextmanager
def parsed_yaml_kept_in(path: Path | str) -> Iterator[ParsedYaml]:
    """Within it, run folders' YAML files are read through ``ParsedYaml(path)``, saved at the end.

    Args:
        path: the JSON file that keeps the parsed files (a report's ``.sam-report-cache.json``).

    Yields:
        The ``ParsedYaml`` in use.
    """
    parsed = ParsedYaml(path)
    token = _PARSED.set(parsed)
    try:
        yield parsed
        parsed.save()
    finally:
        _PARSED.reset(token)


def unflatten(flat: dict) -> dict:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (the inverse of settings.flatten)."""
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def get(cfg: Mapping | None, dotted: str) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; None where a part is missing."""
    for part in dotted.split("."):
        if not isinstance(cfg, dict):
            return None
        cfg = cfg.get(part)
    return cfg


# the variants whose class says ``has_rho = False``, named here so that the readers of run
# folders need not import the variants (torch) to tell; tests/test_registry.py checks it
NO_RHO = frozenset({"base", "le_sam"})


def has_rho(variant: str) -> bool:
    """Whether a variant's ``optimizer.rho`` is a perturbation radius (not for ``base``; an unknown
    variant is taken at its configured ρ).

    Args:
        variant: the variant's name (``optimizer.name``).

    Returns:
        False for the variants in ``NO_RHO``, else True.
    """
    return variant not in NO_RHO


class RunDir:
    """A job folder sam-run wrote (see the module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- files as they are
    @cached_property
    def summary(self) -> dict | None:
        """summary.json's contents (None when absent or not an object)."""
        s = read_json(self.path / SUMMARY)
        return s if isinstance(s, dict) else None

    @property
    def status(self) -> str:
        """The summary's status, or ``missing``."""
        s = (self.summary or {}).get("status")
        return s if s in STATUSES else "missing"

    @property
    def missing_reason(self) -> str:
        """Why the run has no readable summary: corrupt, still training (who holds its lock),
        or neither (running elsewhere, or killed)."""
        from .lock import held_by

        problem = json_problem(self.path / SUMMARY)
        if problem not in (None, "missing"):
            return f"summary.json is {problem}"
        if problem is None:  # valid JSON, and no status: {} or another program's file
            return "its summary.json holds no status (sam-run writes one in every summary)"
        if not made_by_sam_run(self.path):
            return "not a job of sam-run (its .hydra/config.yaml has no trainer or optimizer)"
        holder = held_by(self.path, "train")
        if holder:
            return f"no summary.json: being trained by {holder}"
        return "no summary.json: running, or killed"

    @cached_property
    def saved_overrides(self) -> list[str] | None:
        """The overrides the job was made with: ``.hydra/overrides.yaml``, else summary.json's;
        None when neither records them, or when overrides.yaml is unreadable (then which job the
        folder holds is not known)."""
        path = self.path / OVERRIDES
        if path.exists():
            saved = _read_yaml(path)
            return [str(o) for o in saved] if isinstance(saved, list) else None
        saved = (self.summary or {}).get("overrides")
        return None if saved is None else [str(o) for o in saved]

    @property
    def overrides(self) -> list[str]:
        """``saved_overrides``, with summary.json's where overrides.yaml is unreadable; [] when
        nothing records them."""
        if self.saved_overrides is not None:
            return self.saved_overrides
        return [str(o) for o in (self.summary or {}).get("overrides") or []]

    def checked_rows(self) -> tuple[list[dict], str | None]:
        """(``rows()``, the first of the run's own files that is there but cannot be read, and
        why: ``summary.json is corrupt (not JSON: ...)``, ``metrics.jsonl is unreadable
        (Permission denied)``; None when each is readable or absent), from one read of each. A
        last metrics line cut by a kill, of a run without a summary (stopped, or still
        training), is no fault: resuming drops it."""
        rows, bad, last = scan_rows(self.path / METRICS)
        if self.summary is None and (self.path / SUMMARY).exists():
            return rows, f"{SUMMARY} is {json_problem(self.path / SUMMARY)}"
        config = self.path / CONFIG
        if self.hydra_config is None and config.exists():
            try:
                config.read_text()
                problem = "corrupt (not a YAML mapping)"
            except OSError as e:
                problem = f"unreadable ({e.strerror or type(e).__name__})"
            return rows, f"{CONFIG} is {problem}"
        if bad is None or (last and self.summary is None):
            return rows, None
        return rows, f"{METRICS} is {bad if bad.startswith('unreadable') else f'corrupt ({bad})'}"

    @cached_property
    def hydra_config(self) -> dict | None:
        """``.hydra/config.yaml``'s contents (None when absent or not a mapping)."""
        cfg = _read_yaml(self.path / CONFIG)
        return cfg if isinstance(cfg, dict) else None

    def rows(self) -> list[dict]:
        """metrics.jsonl's rows, read once (the report's sections share them: not to be changed)."""
        return self._rows

    @cached_property
    def _rows(self) -> list[dict]:
        return read_rows(self.path / METRICS)

    def clients(self) -> dict | None:
        """A federated run's split (clients.json): sizes and class histograms; None otherwise."""
        return read_json(self.path / CLIENTS)

    def eval(self, weights: str = "last") -> dict | None:
        """The evaluation file of ``weights`` (None when absent or not an object)."""
        e = read_json(self.path / eval_file(weights))
        return e if isinstance(e, dict) else None

    def landscape(self, weights: str = "last") -> dict | None:
        """The landscape summary of ``weights`` (None when absent or not an object)."""
        s = read_json(self.path / landscape_folder(weights) / LANDSCAPE_SUMMARY)
        return s if isinstance(s, dict) else None

    def pair_summaries(self, weights: str = "last") -> list[dict]:
        """The connectivity results stored under the run's landscape folder."""
        folder = self.path / landscape_folder(weights)
        if not folder.is_dir():  # most jobs: one stat, not a glob
            return []
        return [
            s
            for p in sorted(folder.glob(f"*/{LANDSCAPE_SUMMARY}"))
            if isinstance(s := read_json(p), dict) and isinstance(s.get("run_b"), dict)
        ]

    # ---- the config
    def config(self, checkpoint: bool = True) -> dict:
        """The composed config (see the module docstring); {} when nothing records it (or only
        the checkpoint does and ``checkpoint`` is False: torch-free readers)."""
        if self.hydra_config is not None:
            return self.hydra_config
        flat = (self.summary or {}).get("config")
        if not isinstance(flat, dict) and checkpoint and (self.path / CHECKPOINT).is_file():
            flat = (self.checkpoint().get("fingerprint") or {}).get("config")
        return unflatten(flat) if isinstance(flat, dict) else {}

    def get(self, dotted: str, checkpoint: bool = False) -> Any:
        """The config's value at ``dotted`` (None where a part is missing)."""
        return get(self.config(checkpoint), dotted)

    def omega_config(self, purpose: str = "sam-landscape") -> DictConfig:
        """The config as an OmegaConf, its interpolations resolving here, with this
        environment's data folder where the run's is absent or gone."""
        from omegaconf import OmegaConf

        path = self.path / CONFIG
        if path.is_file():
            try:
                cfg = OmegaConf.load(path)
            except Exception as e:
                raise UserError(f"{path} is unreadable ({type(e).__name__}); restore it") from None
        else:
            tree = self.config()
            require(
                bool(tree),
                f"run folder {self.path} has no .hydra/config.yaml and its checkpoint records no "
                f"settings; {purpose} cannot rebuild its model",
            )
            cfg = OmegaConf.create(tree)
        _data_dir_here(cfg)
        return cfg

    # ---- the weights
    @cached_property
    def _last(self) -> dict | None:
        return Checkpoint(self.path / CHECKPOINT).load()

    def checkpoint(self) -> dict:
        """last.pt, loaded weights-only (a one-line error when it is missing)."""
        require(
            self._last is not None,
            f"run folder {self.path} has no checkpoint ({CHECKPOINT}); its weights are needed",
        )
        return self._last


def run_label(described: dict) -> str:
    """A run as a figure's title names it: ``sam, ρ = 0.05, seed 0``, a sweep's job with its
    number (``job 3 (sam, ...)``); never the folder's name, which a sweep makes long."""
    rho = described.get("rho")
    text = f"{described.get('variant', '?')}{f', ρ = {rho:g}' if rho is not None else ''}"
    text += f", seed {described.get('seed', '?')}"
    name = Path(str(described.get("run", ""))).name
    return f"job {name} ({text})" if name.isdigit() else text


def _data_dir_here(cfg) -> None:
    """dataset.data_dir (and download) of this environment where the run's is absent or gone."""
    from omegaconf import OmegaConf

    from .paths import config_dir

    default = OmegaConf.load(Path(config_dir()) / "common" / "dataset.yaml")
    try:
        here = Path(str(cfg.dataset.data_dir)).is_dir()
    except Exception:  # absent, or an interpolation this environment cannot resolve
        here = False
    if not here:
        cfg.dataset.data_dir = default.data_dir
    if cfg.dataset.get("download") is None:
        cfg.dataset.download = default.download


def model_state(run: RunDir, weights: str = "last") -> dict:
    """The model state dict of a run's ``last.pt`` or ``averaged.pt`` (weights only)."""
    if check_weights(weights) == "last":
        return run.checkpoint()["model"]
    path = run.path / AVERAGED
    require(
        path.is_file(),
        f"run folder {run.path} has no averaged weights ({AVERAGED}); train it with "
        "trainer.weight_averaging=swa or ema, or use weights=last",
    )
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{path} is unreadable ({type(e).__name__}); restore it") from None
    require(
        isinstance(state, dict) and isinstance(state.get("model"), dict),
        f"{path} is not a sam-run averaged checkpoint (no model entry)",
    )
    return state["model"]
