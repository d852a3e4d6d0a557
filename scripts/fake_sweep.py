"""Fake sweeps for the cost benches: one real small job folder copied ``n`` times, each copy
made the job of its number (``seed=<n>`` in its recorded overrides), so that the runner's
commands meet a study's worth of completed jobs without training them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml


def copy_jobs(job_dir, sweep_dir, n: int, multirun_yaml=None, checkpoints=False) -> Path:
    """``sweep_dir`` holding jobs 0..n-1, each a copy of ``job_dir`` with ``seed=<number>``
    (times kept; checkpoints hard-linked when asked, else left out: a completed job is
    recognised without them, a measured one is fresh only beside them)."""
    job_dir, sweep_dir = Path(job_dir), Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    for num in range(n):
        dst = sweep_dir / str(num)
        shutil.copytree(job_dir, dst, ignore=shutil.ignore_patterns("checkpoints"))
        if checkpoints and (job_dir / "checkpoints").is_dir():
            shutil.copytree(job_dir / "checkpoints", dst / "checkpoints", copy_function=os.link)
        _reseed(dst, num)
    if multirun_yaml is not None:
        shutil.copy(multirun_yaml, sweep_dir / "multirun.yaml")
    return sweep_dir


def _with_seed(overrides: list[str], num: int) -> list[str]:
    return [o for o in overrides if not o.startswith("seed=")] + [f"seed={num}"]


def _reseed(job: Path, num: int) -> None:
    path = job / ".hydra" / "overrides.yaml"
    path.write_text(yaml.safe_dump(_with_seed(yaml.safe_load(path.read_text()), num)))
    summary = json.loads((job / "summary.json").read_text())
    summary["overrides"] = _with_seed(summary.get("overrides") or [], num)
    if isinstance(summary.get("config"), dict) and "seed" in summary["config"]:
        summary["config"]["seed"] = num
    (job / "summary.json").write_text(json.dumps(summary))
    cfg = job / ".hydra" / "config.yaml"
    if cfg.exists():
        tree = yaml.safe_load(cfg.read_text())
        tree["seed"] = num
        cfg.write_text(yaml.safe_dump(tree, sort_keys=False))
