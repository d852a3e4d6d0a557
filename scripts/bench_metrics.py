"""Bench section: curvature metrics (python scripts/bench.py --only metrics).

- lanczos_hvps_over_power_hvps_<model>: HVPs Lanczos needs to come within 1e-3 of λ_max over
  the HVPs plain power iteration needs (both stopped by an oracle that knows λ_max: the
  algorithms' convergence, side by side), summed over seeded start vectors (5 on the default
  model, 3 on ResNet-18). lanczos_rule_hvps_over_power_hvps_<model>: Lanczos stopped by its
  own residual rule (what a run does; it certifies 1e-3 and usually overshoots it) over the
  same oracle-stopped power iteration. Models: the default cnn1d on MNIST-1D at
  initialization, on 4096 samples; a CIFAR ResNet-18 on 32 random 32x32 inputs (offline).
  Power iteration is capped (300 HVPs on ResNet-18): ``power_capped_<model>`` says the
  power count, and so the ratio's denominator, is then a lower bound.
- hvp_over_grad: one HVP (from scratch, forward included) over one gradient on the same batch,
  with the method ``auto`` chose; hvp_cached_over_grad: an HVP reusing the gradient graph,
  as Lanczos does when the graphs fit in ``graph_cache_mb``.
- metrics_overhead: wall time of the default run over the same run with metrics=off (curvature
  off): five pairs, alternated (on, off, off, on, ...: slow drift cancels), the median of the
  pairs' ratios. On this shared machine one run's time varies by ±20% from run to run, which
  this ratio inherits; ``metrics_overhead_parts`` = 1 + ``metrics_hessian_s`` / the off runs'
  median wall time is the steadier cross-check, ``metrics_hessian_s`` being the median of the
  on runs' own ``hessian_time_s`` (the measurement's wall time, logged by the run).
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.nn.functional as F
from benchutil import interleaved_ratio
from omegaconf import OmegaConf

from sam_runner.metrics.hvp import HessianOperator
from sam_runner.metrics.solvers import lanczos, tridiagonal
from sam_runner.models import build_model


def power_iteration(
    matvec, n, tol=1e-3, max_iter=1000, generator=None, device="cpu", reference=None
):
    """Plain power iteration (for comparison): stops when |estimate − reference| ≤ tol·|reference|
    (an oracle rule, generous to power iteration) or, without a reference, on the relative
    change."""
    v = torch.randn(n, generator=generator, dtype=torch.float64).to(
        device=device, dtype=torch.float32
    )
    v = v / v.norm()
    est, prev = 0.0, None
    for it in range(1, max_iter + 1):
        w = matvec(v)
        est = float(torch.dot(w, v))
        if reference is not None and abs(est - reference) <= tol * abs(reference):
            return est, it
        if reference is None and prev is not None and abs(est - prev) <= tol * abs(est):
            return est, it
        prev = est
        v = w / w.norm()
    return est, max_iter


def _hvp_ratio(model, x, y, repeats):
    batches = [(x, y)]
    ps = [p for p in model.parameters() if p.requires_grad]
    with HessianOperator(model, F.cross_entropy, batches, "auto") as op:
        method = op.method
        v = torch.randn(op.numel)
        cached = interleaved_ratio(
            lambda: op(v), lambda: torch.autograd.grad(F.cross_entropy(model(x), y), ps), repeats
        )
    # no graph reuse
    with HessianOperator(model, F.cross_entropy, batches, method, graph_cache_mb=0) as op:
        ratio = interleaved_ratio(
            lambda: op(v), lambda: torch.autograd.grad(F.cross_entropy(model(x), y), ps), repeats
        )
    return method, ratio, cached


def _prefix_counts(r, ref, tol=1e-3):
    """From one Lanczos run's tridiagonal: the first step whose top Ritz value is within tol of
    ``ref`` (oracle), and the first step the residual rule would have stopped at (rule)."""
    oracle = rule = None
    for j in range(1, len(r.alphas) + 1):
        vals, vecs = torch.linalg.eigh(tridiagonal(r.alphas[:j], r.betas))
        theta, residual = float(vals[-1]), abs(r.betas[j - 1] * float(vecs[-1, -1]))
        if oracle is None and abs(theta - ref) <= tol * abs(ref):
            oracle = j
        if rule is None and residual <= tol * abs(theta):
            rule = j
    return oracle, rule


def _hvp_counts(model, batches, seeds, power_cap):
    """HVPs to reach 1e-3 relative of λ_max, summed over ``seeds`` start vectors: Lanczos (oracle:
    the first step within 1e-3; rule: where its residual rule stops), and power iteration
    (oracle; capped at ``power_cap``, in which case the power count is a lower bound). The first
    seed's Lanczos runs to 1e-5 for the reference λ_max; the others stop on the rule at 1e-3.
    The prefixes of a run's tridiagonal are the shorter runs, so one run gives both counts."""
    lanczos_oracle = lanczos_rule = power = 0
    capped, ref = False, None
    with HessianOperator(model, F.cross_entropy, batches, "double_backward") as op:
        for seed in seeds:
            oracle = None
            for tol in ([1e-3] if ref is not None else []) + [1e-5]:
                if oracle is None:
                    # every vector kept: the prefixes of one tridiagonal are the shorter runs
                    g = torch.Generator().manual_seed(seed)
                    r = lanczos(op, op.numel, 1, tol, 150, generator=g, max_vectors=None)
                    ref = r.values[0] if ref is None else ref
                    oracle, rule = _prefix_counts(r, ref)
            _, p = power_iteration(
                op, op.numel, 1e-3, power_cap, torch.Generator().manual_seed(seed), reference=ref
            )
            capped |= p >= power_cap
            lanczos_oracle, lanczos_rule, power = (
                lanczos_oracle + oracle,
                lanczos_rule + rule,
                power + p,
            )
    return lanczos_oracle, lanczos_rule, power, capped


def _count_keys(name, counts) -> dict:
    oracle, rule, power, capped = counts
    return {
        f"lanczos_hvps_{name}": oracle,
        f"lanczos_rule_hvps_{name}": rule,
        f"power_hvps_{name}": power,
        f"lanczos_hvps_over_power_hvps_{name}": oracle / power,
        f"lanczos_rule_hvps_over_power_hvps_{name}": rule / power,
        f"power_capped_{name}": capped,
    }


def _default_run(quick, metrics):
    import tempfile
    from pathlib import Path

    from hydra import compose, initialize_config_dir

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
        wall = time.perf_counter() - t0
        last = json.loads(Path(d, "metrics.jsonl").read_text().splitlines()[-1])
        return wall, last.get("hessian_time_s", 0.0)


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    repeats = 2 if quick else max(3, int(getattr(args, "repeats", 5)))
    out = {}
    torch.manual_seed(0)
    from sam_runner.data import build_data

    data_cfg = OmegaConf.create(
        {
            "name": "mnist1d",
            "data_dir": str(__import__("os").path.expanduser("~/.cache/sam-runner")),
            "download": True,
            "batch_size": 128,
            "num_samples": 5000,
        }
    )
    data = build_data(data_cfg, torch.device("cpu"), 0)
    x, y = data.train_subset(512 if quick else 4096, 0)
    cnn = build_model(
        OmegaConf.create({"arch": "cnn1d", "channels": 32}), data.input_shape, 10
    ).eval()
    out.update(
        _count_keys(
            "cnn1d",
            _hvp_counts(
                cnn,
                [(x[i : i + 1024], y[i : i + 1024]) for i in range(0, len(y), 1024)],
                range(1 if quick else 5),
                2000,
            ),
        )
    )
    method, ratio, cached = _hvp_ratio(cnn, x[:1024], y[:1024], repeats)
    out.update(hvp_method=method, hvp_over_grad=ratio, hvp_cached_over_grad=cached)

    # ResNet-18 HVPs cost ~1 s each on 2 CPU cores: power iteration needs hundreds
    n = 16 if quick else 32
    resnet = build_model(OmegaConf.create({"arch": "resnet18"}), (3, 32, 32), 10).eval()
    g = torch.Generator().manual_seed(0)
    xr, yr = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
    out.update(
        _count_keys(
            "resnet18",
            _hvp_counts(resnet, [(xr, yr)], range(1 if quick else 3), 100 if quick else 300),
        )
    )

    # whole runs (~25 s each), alternated ABBA
    on, off = [], []
    for i in range(1 if quick else 5):
        for metrics in ("default", "off") if i % 2 == 0 else ("off", "default"):
            (on if metrics == "default" else off).append(_default_run(quick, metrics))
    hessian_s, off_s = statistics.median(h for _, h in on), statistics.median(w for w, _ in off)
    out.update(
        metrics_run_s=statistics.median(w for w, _ in on),
        metrics_off_run_s=off_s,
        metrics_overhead=statistics.median(a[0] / b[0] for a, b in zip(on, off)),
        metrics_hessian_s=hessian_s,
        metrics_overhead_parts=1 + hessian_s / off_s,
    )
    return out
