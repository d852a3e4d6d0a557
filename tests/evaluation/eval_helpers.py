"""One real trained sweep shared by the evaluation tests (trained once per test session), and
copies of it to measure."""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# 2 variants x 2 seeds of a small BatchNorm model with label noise, the corruptions on at the
# final evaluation; λ_max on 256 samples, each epoch (so that the last one is warm-started, from
# another vector than sam-eval's)
TRAIN_ARGS = [
    "-m",
    "model=cnn1d",
    "model.channels=8",
    "optimizer=base,sam",
    "seed=0,1",
    "trainer.epochs=2",
    "dataset.num_samples=1000",
    "dataset.label_noise=0.2",
    "metrics.hessian.num_samples=256",
    "metrics.hessian.every_n_epochs=1",  # the final measurement starts from epoch 1's vector
    "metrics.corruptions.enabled=true",
    "trainer.progress=none",
]
# the same measurement settings as training's
EVAL_ARGS = ["metrics.hessian.num_samples=256", "metrics.corruptions.enabled=true"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


@functools.lru_cache(maxsize=None)
def trained_sweep() -> Path:
    root = Path(tempfile.mkdtemp(prefix="sam-eval-"))
    atexit.register(shutil.rmtree, root, True)
    sweep = root / "sweep"
    sam_run(*TRAIN_ARGS, f"hydra.sweep.dir={sweep}")
    return sweep


def sam_run(*args: str) -> None:
    """``sam-run args`` in a process of its own (one torch thread), which must succeed."""
    proc = subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def copy_of(sweep: Path, dst: Path) -> Path:
    return Path(shutil.copytree(sweep, dst, ignore=shutil.ignore_patterns(".sam-eval")))


def sam_eval(*args) -> tuple[int, str, str]:
    """``sam-eval`` in this process: (exit status, stdout, stderr)."""
    from sam_runner.evaluation.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def fingerprint(folder: Path) -> dict:
    """sha256 of every file under a folder but eval.json (what sam-eval must not touch)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
        and p.name not in ("eval.json", ".eval.lock")  # the lock: sam-eval's own, while it measures
        and ".sam-eval" not in p.parts
    }


JOBS = ("0", "1", "2", "3")
