"""Bench section: curvature metrics (python scripts/bench.py --only metrics).

- lanczos_hvps_over_power_hvps_<model>: HVPs Lanczos (residual rule, tol 1e-3) takes over the
  HVPs plain power iteration takes to come within 1e-3 of the same λ_max (an oracle stop,
  generous to power iteration). Models: the default cnn1d on MNIST-1D, and a CIFAR ResNet-18
  on 64 random 32x32 inputs (CIFAR need not be present; random inputs keep the figure offline).
- hvp_over_grad: one HVP (from scratch, forward included) over one gradient on the same batch,
  with the method ``auto`` chose; hvp_cached_over_grad: an HVP reusing the gradient graph,
  as Lanczos does when the graphs fit in ``graph_cache_mb``.
- metrics_overhead: wall time of the default run over the same run with metrics=off.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from benchutil import interleaved_ratio

from sam_runner.metrics.hessian import HessianOperator, lanczos, power_iteration
from sam_runner.models import build_model


def _hvp_ratio(model, x, y, repeats):
    batches = [(x, y)]
    ps = [p for p in model.parameters() if p.requires_grad]
    with HessianOperator(model, F.cross_entropy, batches, "auto") as op:
        method = op.method
        v = torch.randn(op.numel)
        cached = interleaved_ratio(lambda: op(v), lambda: torch.autograd.grad(F.cross_entropy(model(x), y), ps),
                                   repeats)
    with HessianOperator(model, F.cross_entropy, batches, method, graph_cache_mb=0) as op:  # no graph reuse
        ratio = interleaved_ratio(lambda: op(v), lambda: torch.autograd.grad(F.cross_entropy(model(x), y), ps),
                                  repeats)
    return method, ratio, cached


def _hvp_counts(model, batches, seed=0):
    with HessianOperator(model, F.cross_entropy, batches, "double_backward") as op:
        ref = lanczos(op, op.numel, 1, 1e-5, 300, generator=torch.Generator().manual_seed(seed + 1)).values[0]
        r = lanczos(op, op.numel, 1, 1e-3, 300, generator=torch.Generator().manual_seed(seed))
        _, power = power_iteration(op, op.numel, 1e-3, 2000, torch.Generator().manual_seed(seed), reference=ref)
    assert abs(r.values[0] - ref) <= 1e-3 * abs(ref)
    return r.hvps, power


def _default_run(quick, metrics):
    from hydra import compose, initialize_config_dir
    from pathlib import Path
    import tempfile
    from sam_runner.cli import register_resolvers
    from sam_runner.train import train
    register_resolvers()
    conf = str(Path(__file__).resolve().parents[1] / "conf")
    over = [f"metrics={metrics}", "trainer.progress=none", "trainer.device=cpu"]
    if quick:
        over.append("trainer.epochs=2")
    with initialize_config_dir(conf, version_base=None):
        cfg = compose("config", overrides=over)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        train(cfg, d)
        return time.perf_counter() - t0


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    repeats = 2 if quick else max(3, int(getattr(args, "repeats", 5)))
    out = {}
    torch.manual_seed(0)
    from sam_runner.data import build_data
    data_cfg = OmegaConf.create({"name": "mnist1d", "data_dir": str(__import__("os").path.expanduser(
        "~/.cache/sam-runner")), "download": True, "batch_size": 128, "num_samples": 5000})
    data = build_data(data_cfg, torch.device("cpu"), 0)
    x, y = data.train_subset(512 if quick else 4096, 0)
    cnn = build_model(OmegaConf.create({"arch": "cnn1d", "channels": 32}), data.input_shape, 10).eval()
    hv, pw = _hvp_counts(cnn, [(x[i:i + 1024], y[i:i + 1024]) for i in range(0, len(y), 1024)])
    out.update(lanczos_hvps_cnn1d=hv, power_hvps_cnn1d=pw, lanczos_hvps_over_power_hvps_cnn1d=hv / pw)
    method, ratio, cached = _hvp_ratio(cnn, x[:1024], y[:1024], repeats)
    out.update(hvp_method=method, hvp_over_grad=ratio, hvp_cached_over_grad=cached)

    n = 16 if quick else 32  # ResNet-18 HVPs cost ~1 s each on 2 CPU cores: power iteration needs hundreds
    resnet = build_model(OmegaConf.create({"arch": "resnet18"}), (3, 32, 32), 10).eval()
    g = torch.Generator().manual_seed(0)
    xr, yr = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
    hv, pw = _hvp_counts(resnet, [(xr[i:i + 64], yr[i:i + 64]) for i in range(0, n, 64)])
    out.update(lanczos_hvps_resnet18=hv, power_hvps_resnet18=pw, lanczos_hvps_over_power_hvps_resnet18=hv / pw)

    on, off = _default_run(quick, "default"), _default_run(quick, "off")
    out.update(metrics_run_s=on, metrics_off_run_s=off, metrics_overhead=on / off)
    return out
