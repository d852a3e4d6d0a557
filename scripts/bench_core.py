"""Backbone figures: the default run's wall time and the loader's overhead.

default_run_s    wall seconds of `sam-run` with no overrides (subprocess, fresh run folder)
loader_overhead  epoch time through TensorLoader (shuffle, augmentation, normalisation) over
                 the forward-backward-step time of the very same batches, pre-materialised
                 (target <= 1.10), on MNIST-1D/cnn1d and on CIFAR-shaped uint8 data/cnn
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchutil import interleaved_ratio
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]


def default_run_s(repeats: int) -> tuple[float, float]:
    walls, accs = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "sam_runner.cli", f"hydra.run.dir={d}"],
                cwd=ROOT,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            walls.append(time.perf_counter() - t0)
            accs.append(json.loads((Path(d) / "summary.json").read_text())["test_acc"])
    return statistics.median(walls), statistics.median(accs)


def _loader_ratio(data, model, repeats):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def fb(x, y):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    data.train.set_epoch(1)
    batches = [(x.clone(), y.clone()) for x, y, _ in data.train]

    def through_loader():
        for x, y, _ in data.train:
            fb(x, y)

    def pre_made():
        for x, y in batches:
            fb(x, y)

    return interleaved_ratio(through_loader, pre_made, repeats=repeats)


def run(args) -> dict:
    from sam_runner.data import build_data
    from sam_runner.models import build_model

    torch.manual_seed(0)
    out = {}
    repeats = 1 if args.quick else max(1, min(args.repeats, 3))
    out["default_run_s"], out["default_run_test_acc"] = default_run_s(repeats)
    cpu = torch.device("cpu")
    cache = str(Path.home() / ".cache" / "sam-runner")
    d = build_data(
        OmegaConf.create(
            dict(name="mnist1d", data_dir=cache, batch_size=128, download=True, num_samples=5000)
        ),
        cpu,
        0,
    )
    m = build_model(OmegaConf.create({"arch": "cnn1d"}), d.input_shape, d.num_classes)
    out["loader_overhead_mnist1d"] = _loader_ratio(d, m, 3 if args.quick else args.repeats)
    # CIFAR-shaped: uint8 images held in memory, crop+flip+normalise per batch on tensors
    from sam_runner.data import Data
    from sam_runner.data.loaders import Normalize, TensorLoader
    from sam_runner.data.sources import CIFAR_STATS

    n = 2048 if args.quick else 8192
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    loader = TensorLoader(
        x,
        y,
        128,
        shuffle=True,
        seed=0,
        drop_last=True,
        transform=Normalize(*CIFAR_STATS["cifar10"], augment=True),
    )
    m2 = build_model(OmegaConf.create({"arch": "cnn"}), (3, 32, 32), 10)
    out["loader_overhead_cifar"] = _loader_ratio(
        Data(loader, None, 10, (3, 32, 32), n), m2, 3 if args.quick else args.repeats
    )
    out["loader_overhead"] = max(out["loader_overhead_mnist1d"], out["loader_overhead_cifar"])
    return out
