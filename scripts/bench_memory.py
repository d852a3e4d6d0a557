"""Bench section: peak memory (python scripts/bench.py --only memory). Each figure is the peak
memory a piece of work adds, over a reference size, measured in a fresh process per sample
(median of the samples): the peak of torch's own allocations, on CUDA its allocator's peak, on a
CPU the running sum of the profiler's allocation and free events (live tensors, as CUDA's
allocator counts them; not what the C library keeps for reuse or the process loads once).

lanczos_peak_memory_over_params  a 100-step Lanczos run for λ_max (tol 1e-5, so that it does
                             not stop: the float32 basis of the default tolerance) on a
                             2,000,000-dimensional operator that allocates only its result (a
                             diagonal Hessian with a uniform spectrum, so that the figure is the
                             solver's own storage), over the bytes of 2,000,000 float32
                             parameters
sam_peak_memory_over_davda54 the peak of building ResNet-18 (CIFAR, 10 classes) with SAM over
                             SGD (momentum 0.9) and taking two steps on batches of 32 (the second
                             measured with the first's state in place), our SAM with the LBFGS-
                             convention closure (set_to_none gradients), over the same with
                             davda54/sam's algorithm (first_step(zero_grad=True), second pass,
                             second_step; re-implemented here from its published description)
base_peak_memory_over_bare   the same with optimizer=base (our Base over SGD) over a bare loop
                             (zero_grad, forward, backward, SGD step)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def peak_added(fn) -> int:
    """Bytes of memory ``fn()`` adds at its peak, over what was held before it: torch's own
    allocations on either device (CUDA's peak allocated; on a CPU the running sum of the
    profiler's allocation and free events), so that the figure counts tensors, not what the
    C library keeps or the process loads."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    held = peak = 0
    for _, nbytes in changes:
        held += nbytes
        peak = max(peak, held)
    return peak


def _lanczos_child() -> dict:
    from sam_runner.metrics.solvers import lanczos

    n = 2_000_000
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spectrum = torch.linspace(0.0, 1.0, n, device=device)

    def matvec(v):
        return spectrum * v

    g = torch.Generator().manual_seed(0)
    steps = {}

    def run():
        steps["hvps"] = lanczos(matvec, n, 1, 1e-5, 100, generator=g, device=device).hvps

    added = peak_added(run)
    return {"ratio": added / (4 * n), "hvps": steps["hvps"]}


class Davda54SAM(torch.optim.Optimizer):
    """davda54/sam's SAM as its README describes it: ``first_step`` saves θ (a clone per
    parameter, in the optimizer state), adds e(w) = ρ g/‖g‖ and zeroes the gradients;
    ``second_step`` puts θ back (``p.data = old_p``) and steps the base optimizer."""

    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.norm(torch.stack([p.grad.norm(p=2) for p in params]), p=2)
        for group in self.param_groups:
            scale = group["rho"] / (norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * scale)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


def _resnet18(batch: int = 32):
    from omegaconf import OmegaConf

    from sam_runner.models import build_model

    torch.manual_seed(0)
    model = build_model(OmegaConf.create({"arch": "resnet18"}), (3, 32, 32), 10)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return model, x, y


def _steps_child(kind: str, batch: int = 32) -> dict:
    """Peak memory of building ResNet-18 and its optimizer and taking two steps on batches of
    ``batch`` (bytes)."""
    from sam_runner.optim import SAM
    from sam_runner.optim.base import Base

    sgd = dict(lr=0.05, momentum=0.9)
    makers = {
        "sam": lambda m: SAM(m.parameters(), torch.optim.SGD, rho=0.05, model=m, **sgd),
        "davda54": lambda m: Davda54SAM(m.parameters(), torch.optim.SGD, rho=0.05, **sgd),
        "base": lambda m: Base(m.parameters(), torch.optim.SGD, model=m, **sgd),
        "bare": lambda m: torch.optim.SGD(m.parameters(), **sgd),
    }

    def run():
        model, x, y = _resnet18(batch)
        _two_steps(kind, model, makers[kind](model), x, y)

    return {"bytes": peak_added(run)}


def _two_steps(kind, model, opt, x, y) -> None:
    import torch.nn.functional as F

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(2):
        if kind == "davda54":
            F.cross_entropy(model(x), y).backward()
            opt.first_step(zero_grad=True)
            F.cross_entropy(model(x), y).backward()
            opt.second_step(zero_grad=True)
        elif kind == "bare":
            closure()
            opt.step()
        else:
            opt.step(closure)


CHILDREN = {
    "lanczos": _lanczos_child,
    **{kind: (lambda kind=kind: _steps_child(kind)) for kind in ("sam", "davda54", "base", "bare")},
}


def _in_child(name: str) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, __file__, name], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_child(name: str, repeats: int) -> dict:
    samples = [_in_child(name) for _ in range(repeats)]
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def run(args) -> dict:
    repeats = 1 if args.quick else min(args.repeats, 3)
    lz = median_child("lanczos", repeats)
    out = {"lanczos_peak_memory_over_params": lz["ratio"], "lanczos_bench_hvps": lz["hvps"]}
    peak = {}
    for _ in range(repeats):  # side by side: each pair's processes one after the other
        for kind in ("sam", "davda54", "base", "bare"):
            peak.setdefault(kind, []).append(_in_child(kind)["bytes"])
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(peak[a], peak[b]))  # noqa: E731
    out["sam_peak_memory_over_davda54"] = ratio("sam", "davda54")
    out["base_peak_memory_over_bare"] = ratio("base", "bare")
    out["sam_peak_mb"] = statistics.median(peak["sam"]) / 2**20
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(CHILDREN[sys.argv[1]]()))
