"""Scale-out figures: 2 gloo processes over 1 on the CPU (same global batch), and a sweep
job's overhead from its launch to its first training step.

    python scripts/bench.py --only scale [--quick]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _epoch_seconds(world: int, epochs: int, samples: int) -> float:
    """Median seconds of one training epoch (evaluation excluded) in ``world`` processes."""
    from hydra import compose, initialize_config_dir

    from sam_runner import distributed
    from sam_runner.paths import config_dir
    from sam_runner.train import train

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=mlp",
                f"dataset.num_samples={samples}",
                "dataset.batch_size=128",
                f"trainer.epochs={epochs}",
                "trainer.device=cpu",
                "trainer.progress=none",
                "metrics.hessian.enabled=false",
                "optimizer.sync_perturbation=true",
            ],
        )
    with tempfile.TemporaryDirectory() as d:
        if world == 1:
            # the thread budget per process the launcher gives 2 processes, so that the ratio
            # measures data parallelism, not a change of thread count
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
            try:
                summary = train(cfg, d, [])
            finally:
                torch.set_num_threads(threads)
        else:
            summary = distributed.launch(train, (cfg, d, []), world, torch.device("cpu"))
    # train_time_s sums the epochs' training loops; the first epoch (warm-up) is included
    return summary["train_time_s"] / summary["epochs"]


# Run inside the sweep's process: stamps each job's launch (Hydra's run_job for it) and
# its first training step (the first optimizer step of the job) on stderr.
_PROBE = r"""
import sys, time
# the launcher imports run_job from here when Hydra loads it
from hydra.core import utils as hydra_utils
from sam_runner.optim.engine import SharpnessAware
from sam_runner import cli

def stamp(what):
    print(f"@@ {what} {time.time():.6f}", file=sys.stderr, flush=True)

run_job = hydra_utils.run_job
def timed_run_job(*a, **k):
    stamp("launch")
    return run_job(*a, **k)
hydra_utils.run_job = timed_run_job

step = SharpnessAware.step
def timed_step(self, closure=None):
    if not getattr(self, "_bench_stamped", False):
        self._bench_stamped = True
        stamp("step")
    return step(self, closure)
SharpnessAware.step = timed_step
sys.argv = ["sam-run"] + sys.argv[1:]
cli.main()
"""


def sweep_overhead(jobs: int) -> dict:
    """Seconds from launch to first training step in a ``sam-run -m`` sweep of ``jobs`` jobs.

    ``sweep_overhead_s``: median over jobs, from Hydra launching the job to its first step
    (config, run folder, data, model, optimizer). ``sweep_cold_start_s``: from starting the
    command (a fresh Python) to the first job's first step: what every SLURM job pays.
    """
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                _PROBE,
                "-m",
                "model=mlp",
                "dataset.num_samples=2000",
                "trainer.epochs=1",
                "trainer.progress=none",
                "metrics.hessian.enabled=false",
                f"seed={','.join(str(i) for i in range(jobs))}",
                f"hydra.sweep.dir={d}",
            ],
            capture_output=True,
            text=True,
            cwd=d,
            timeout=600,
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench sweep failed: {out.stderr[-2000:]}")
    stamps = re.findall(r"^@@ (launch|step) ([0-9.]+)$", out.stderr, re.M)
    launches = [float(t) for w, t in stamps if w == "launch"]
    steps = [float(t) for w, t in stamps if w == "step"]
    assert len(launches) == len(steps) == jobs, stamps
    return {
        "sweep_overhead_s": statistics.median(s - l for l, s in zip(launches, steps)),
        "sweep_cold_start_s": steps[0] - t0,
    }


def run(args) -> dict:
    repeats = 1 if args.quick else max(1, args.repeats // 2)
    epochs, samples = (2, 2000) if args.quick else (4, 10000)
    ones, twos = [], []
    for _ in range(repeats):  # alternated, so that load on the machine hits both alike
        twos.append(_epoch_seconds(2, epochs, samples))
        ones.append(_epoch_seconds(1, epochs, samples))
    out = {
        "ddp1_epoch_s": statistics.median(ones),
        "ddp2_epoch_s": statistics.median(twos),
        "ddp2_over_ddp1_epoch": statistics.median(t / o for t, o in zip(twos, ones)),
    }
    out.update(sweep_overhead(2 if args.quick else 4))
    return out
