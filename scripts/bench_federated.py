"""Bench section ``federated``: what the federated simulation adds to the optimizer steps.

``federated_round_over_steps``: one round of K = 5 clients × s = 10 local steps (FedSAM: the
global weights copied in, the clients' state reset, the size-weighted running mean, the server
step) over K·s = 50 centralized steps of the same variant on batches of the same size, both
through the runner's own ``Run`` (``EpochLoop.optimizer_step``, the shared engine), taken
alternately,
the median ratio (``benchutil.interleaved_ratio``). The default model on MNIST-1D at batch 32,
one CPU thread; rounds that evaluate (and so measure ε) are not timed: evaluation is not
training.

Keys: ``federated_round_over_steps``, ``fedfft_round_over_steps``.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

from benchutil import interleaved_ratio, single_threaded

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _run(method: str, folder: str):
    from conftest import compose

    from sam_runner.train import Run

    cfg = compose(
        f"federated={method}", "optimizer=sam", "federated.clients=10",
        "federated.participation=0.5", "federated.local_steps=10", "federated.rounds=1000000",
        "federated.eval_every=1000000", "dataset.batch_size=32", "dataset.num_samples=4000",
        "metrics=off", "trainer.progress=none",
    )  # fmt: skip
    run = Run(cfg, Path(folder), [])
    run.setup()
    return run


def _endless(loader):
    """The loader's batches, epoch after epoch, drawn as a run draws them."""
    for epoch in itertools.count(1):
        loader.set_epoch(epoch)
        yield from loader


@single_threaded
def run(args) -> dict:
    from sam_runner.training.evaluation import EpochStats

    out = {}
    repeats = 3 if args.quick else max(args.repeats, 5)
    for method, key in (("fedavg", "federated_round_over_steps"), ("fedfft", "fedfft_round")):
        with tempfile.TemporaryDirectory() as folder:
            r = _run(method, folder)
            fed = r.loop.fed
            steps = fed.per_round * fed.local_steps
            batches = _endless(r.data.train)

            def round_(r=r):
                r.loop.train_epoch()

            def centralized(r=r, steps=steps, batches=batches):
                stats = EpochStats(r.device, r.dist)
                for _ in range(steps):
                    r.loop.optimizer_step(*next(batches), stats)
                stats.log_values()

            out[key if key.endswith("steps") else f"{key}_over_steps"] = interleaved_ratio(
                round_, centralized, repeats
            )
    return out
