"""Bench section "threads": the CPU thread rule (``distributed.cpu_threads``) against one thread,
on this machine as it is (quiet) and with one busy process beside it (loaded), and the
curvature subset's cost per sample in one batch against many.

- threads.rule: the threads the rule gives one process here (its allowed CPUs).
- threads.rule_over_one_step_<quiet|loaded>: one SAM step of the default model (cnn1d, batch
  128 of 1×40 inputs, both passes) with the rule's threads / with one thread.
- threads.rule_over_one_hvp_<quiet|loaded>: one Hessian-vector product on 4,096 samples (8
  batches of 512, on the operator's worker threads) with the rule's threads / with one thread.
- threads.hvp_one_batch_over_many_per_sample: seconds per sample of an HVP on 512 samples
  (one batch) over those of an HVP on 4,096 (eight), both with the rule's threads, quiet.

Loaded: a child process spins on the CPU for the measurement (another job on a shared node).
Each ratio alternates its two settings (``interleaved_ratio``) and takes the median.
"""

from __future__ import annotations

import multiprocessing as mp

import torch
import torch.nn.functional as F
from benchutil import interleaved_ratio

from sam_runner import distributed
from sam_runner.metrics.hvp import HessianOperator
from sam_runner.models import SmallCNN
from sam_runner.optim import SAM


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def _with_threads(n: int, fn):
    def run():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            fn()
        finally:
            torch.set_num_threads(before)

    return run


def _sam_steps(steps: int):
    g = torch.Generator().manual_seed(0)
    model = SmallCNN(1, 1, 10, 32)
    x, y = torch.randn(128, 1, 40, generator=g), torch.randint(0, 10, (128,), generator=g)
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.01, momentum=0.9)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    def run():
        for _ in range(steps):
            opt.step(closure)

    return run


def _operator(samples: int) -> HessianOperator:
    g = torch.Generator().manual_seed(1)
    model = SmallCNN(1, 1, 10, 32).eval()
    x, y = torch.randn(samples, 1, 40, generator=g), torch.randint(0, 10, (samples,), generator=g)
    batches = [(x[i : i + 512], y[i : i + 512]) for i in range(0, samples, 512)]
    return HessianOperator(model, lambda out, t: F.cross_entropy(out, t), batches)


def _hvp(op: HessianOperator):
    v = torch.randn(op.numel, generator=torch.Generator().manual_seed(2))
    return lambda: op(v)


def _ratios(rule: int, repeats: int, tag: str) -> dict:
    step, many = _sam_steps(5), _operator(4096)
    try:
        hvp = _hvp(many)
        return {
            f"threads.rule_over_one_step_{tag}": interleaved_ratio(
                _with_threads(rule, step), _with_threads(1, step), repeats
            ),
            f"threads.rule_over_one_hvp_{tag}": interleaved_ratio(
                _with_threads(rule, hvp), _with_threads(1, hvp), repeats
            ),
        }
    finally:
        many.close()


def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    rule = distributed.cpu_threads(1)
    out = {"threads.rule": rule, **_ratios(rule, repeats, "quiet")}
    one, many = _operator(512), _operator(4096)
    try:
        per_sample = interleaved_ratio(
            _with_threads(rule, _hvp(one)), _with_threads(rule, _hvp(many)), repeats
        )
        out["threads.hvp_one_batch_over_many_per_sample"] = per_sample * 4096 / 512
    finally:
        one.close()
        many.close()
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        out.update(_ratios(rule, repeats, "loaded"))
    finally:
        stop.set()
        spinner.join(timeout=5)
    return out
