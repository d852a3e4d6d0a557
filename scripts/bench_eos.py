"""Bench section: the cost of tracking λ_max along a full-batch run (python scripts/bench.py
--only eos).

eos_tracking_over_step  the median wall time of one tracked λ_max measurement (warm-started,
                        every 20 steps) over the time of one training step, on the
                        edge_of_stability_mini recipe (GD, MSE, a 1,000-example MNIST-1D subset,
                        a tanh MLP 64-64; target <= 10: tracking at that cadence then costs no
                        more than half the run). Both from one run in this process: the
                        measurements' own hessian_time_s and the run's training time per step
                        (train_time_s excludes measuring).
eos_hvps_per_measurement the median Hessian-vector products per tracked measurement
eos_tracking_share      the share of the run's wall time spent measuring
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _compose(*overrides):
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import compose

    return compose(*overrides)


def tracking(steps: int, optimizer: str = "base") -> dict:
    from sam_runner.train import train

    cfg = _compose(
        "experiment=edge_of_stability_mini",
        f"optimizer={optimizer}",
        "base_optimizer.lr=0.2",
        f"trainer.steps={steps}",
        "trainer.progress=none",
    )
    with tempfile.TemporaryDirectory() as d:
        summary = train(cfg, d, [])
        rows = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    tracked = [r for r in rows if "lambda_max" in r and "train_loss" not in r][1:]  # warm starts
    per_step = summary["train_time_s"] / summary["step"]
    measure = statistics.median(r["hessian_time_s"] for r in tracked)
    wall = rows[-1]["time_s"]
    tail = "" if optimizer == "base" else f"_{optimizer}"
    return {
        f"eos_tracking_over_step{tail}": measure / per_step,
        f"eos_hvps_per_measurement{tail}": statistics.median(r["hessian_hvps"] for r in tracked),
        f"eos_tracking_share{tail}": sum(r["hessian_time_s"] for r in tracked) / wall,
    }


def run(args) -> dict:
    steps = 200 if args.quick else 1000
    return {**tracking(steps), **tracking(steps, "sam")}
