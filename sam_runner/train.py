"""``train(cfg, run_dir, overrides, trial)``: the entry point, kept importable from here; the
training package (``sam_runner.training``) holds the run, its loop and its parts."""

from .training.checkpoint import fingerprint, rank_seed, read_summary, require_resumable
from .training.loop import DTYPES
from .training.run import Run, train

__all__ = [
    "DTYPES",
    "Run",
    "fingerprint",
    "rank_seed",
    "read_summary",
    "require_resumable",
    "train",
]
