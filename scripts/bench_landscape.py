"""Bench section "landscape": what a loss-landscape slice costs (python scripts/bench.py --only
landscape).

- landscape_2d_s: wall seconds of the default 2-D slice's points (21 × 21 = 441: the weights
  set in place, then the training subset and the test set evaluated), on the default model
  (cnn1d, 32 channels, at initialisation: the weights do not change the cost) with 4,096
  MNIST-1D training samples (dataset.num_samples=6000: 4,800 training samples, so the subset
  holds 4,096) and the 1,200 test samples, on the device ``auto`` picks.
- landscape_eval_pass_s: one full evaluation pass over the same samples (``measure()`` at the
  run's weights): the median of 5 calls before each slice.
- landscape_2d_over_eval_pass: landscape_2d_s / landscape_eval_pass_s, per round, the median
  over rounds (target <= 1.1 × 441 = 485.1); landscape_2d_per_point_over_eval_pass: the same
  over 441 (target <= 1.1): what placing the weights and the per-point bookkeeping add.
Rounds: min(--repeats, 3); --quick: one round of a 7 × 7 grid on 1,024 samples.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from benchutil import median_time

from sam_runner.data import build_data
from sam_runner.landscape.directions import filter_normalized
from sam_runner.landscape.evaluate import Evaluator
from sam_runner.landscape.geometry import grid
from sam_runner.models import build_model
from sam_runner.rebuild import LoadedRun

ROOT = Path(__file__).resolve().parents[1]


def _default_run(folder: Path, device) -> LoadedRun:
    """The default config's model and data (MNIST-1D with 6,000 samples), as a loaded run."""
    from hydra import compose, initialize_config_dir

    from sam_runner.cli import register_resolvers

    register_resolvers()
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["dataset.num_samples=6000"])
    torch.manual_seed(cfg.seed)
    data = build_data(cfg.dataset, device, cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(device).eval()
    return LoadedRun(folder, cfg, model.state_dict(), model, data, device)


def _round(ev: Evaluator, dirs, points) -> tuple[float, float]:
    """(seconds of the slice's points, seconds of one evaluation pass), side by side."""
    one = median_time(ev.measure, repeats=5, warmup=1)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    ev.sweep(points, lambda p: ev.move(dirs, p), progress="none")  # ends on a device sync
    return time.perf_counter() - t0, one


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    rounds = 1 if quick else min(3, max(1, int(getattr(args, "repeats", 5))))
    n, size = (1024, 7) if quick else (4096, 21)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as d:
        loaded = _default_run(Path(d), device)
        ev = Evaluator(loaded, n, batch_size=4096)
        dirs = [filter_normalized(loaded.model, s) for s in (0, 1)]
        axis = grid(-1.0, 1.0, size)
        points = [(a, b) for b in axis for a in axis]
        timed = [_round(ev, dirs, points) for _ in range(rounds)]
    ratios = [t / one for t, one in timed]
    return {
        "landscape_device": device.type,
        "landscape_points": len(points),
        "landscape_train_samples": ev.sizes["train_samples"],
        "landscape_test_samples": ev.sizes["test_samples"],
        "landscape_2d_s": statistics.median(t for t, _ in timed),
        "landscape_eval_pass_s": statistics.median(one for _, one in timed),
        "landscape_2d_over_eval_pass": statistics.median(ratios),
        "landscape_2d_per_point_over_eval_pass": statistics.median(ratios) / len(points),
    }
