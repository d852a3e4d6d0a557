"""Shared timing helpers for the bench sections."""

from __future__ import annotations

import statistics
import time

import torch


def median_time(fn, repeats: int = 5, warmup: int = 1, inner: int = 1) -> float:
    """Median wall seconds of ``fn()`` (called ``inner`` times per sample) over ``repeats``
    samples."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def interleaved_ratio(fn_a, fn_b, repeats: int = 5, warmup: int = 1, inner: int = 1) -> float:
    """Median over repeats of time(a)/time(b), a and b measured alternately (side by side)."""
    ratios = []
    for _ in range(warmup):
        fn_a(), fn_b()
    for _ in range(repeats):
        ta = median_time(fn_a, 1, 0, inner)
        tb = median_time(fn_b, 1, 0, inner)
        ratios.append(ta / tb)
    return statistics.median(ratios)


def single_threaded(fn):
    """``fn`` on one CPU thread (restored afterwards), so that a section's ratios do not depend
    on how many cores other processes leave free."""

    def run(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


def set_up_run(*overrides: str):
    """A ``Run`` set up as ``sam-run`` builds one (composed config, data, model, optimizer,
    scheduler, parts), in a temporary folder, for timing its steps (``gpu_parts.Stepper``)."""
    import tempfile
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from sam_runner.cli import register_resolvers
    from sam_runner.paths import config_dir
    from sam_runner.training.run import Run

    register_resolvers()
    overrides = ["trainer.progress=none", "trainer.epochs=1000", *overrides]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    run = Run(cfg, Path(tempfile.mkdtemp()), overrides)
    run.setup()
    return run
