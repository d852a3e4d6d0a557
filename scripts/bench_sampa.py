"""Bench section ``sampa``: SAMPa's two-process form against SAM on one process.

``sampa_2proc_over_sam_step`` (default model: cnn1d on MNIST-1D-shaped input, batch 128) and
``sampa_2proc_over_sam_step_resnet18`` (a CIFAR ResNet-18, batch 32): the wall time of one
SAMPa step on 2 gloo processes (each computes one of its two gradients over the whole global
batch, then one all-reduce) over one SAM step on one process, same model and global batch, one
CPU thread per process. Both run in the same 2 launched processes, alternately: rank 0 times a
SAM step alone (rank 1 waits at a barrier), then both take a SAMPa step; per round the fastest
of a few calls of each, the median of the ratio over rounds. On two GPUs the expectation is
≈ 0.5 + the all-reduce of twice the gradients; on a 2-core CPU shared with other work it is
bounded by the cores free.

    python scripts/bench.py --only sampa [--quick]
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
from bench_optim import _setup, _stepper

CPU = torch.device("cpu")


def _probe(kind: str, rounds: int, calls: int) -> list[float]:
    """In each of 2 launched processes: per round, the fastest SAMPa step over the fastest SAM
    step (rank 0's clock)."""
    from sam_runner import distributed
    from sam_runner.optim import VARIANTS
    from sam_runner.optim.build import parameter_groups

    torch.set_num_threads(1)
    topo, dist = distributed.current(), torch.distributed
    model, x, y = _setup(kind)
    sgd = dict(lr=0.01, momentum=0.9, weight_decay=5e-4)
    sam_model, sampa_model = copy.deepcopy(model), copy.deepcopy(model)
    sam = VARIANTS["sam"](parameter_groups(sam_model), torch.optim.SGD, **sgd).bind(model=sam_model)
    net = torch.nn.parallel.DistributedDataParallel(sampa_model)
    sampa = VARIANTS["sampa"](
        parameter_groups(sampa_model), torch.optim.SGD, sequential_fallback=False, **sgd
    ).bind(model=net)
    sam_step, sampa_step = _stepper(sam, sam_model, x, y), _stepper(sampa, net, x, y)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    for _ in range(2):  # warm up: allocations, ∇f(y) known from the second step on
        if topo.rank == 0:
            sam_step()
        dist.barrier()
        sampa_step()
    ratios = []
    for _ in range(rounds):
        t_sam, t_sampa = [], []
        for _ in range(calls):
            dist.barrier()
            if topo.rank == 0:
                t_sam.append(timed(sam_step))
            dist.barrier()
            t_sampa.append(timed(sampa_step))
        if topo.rank == 0:
            ratios.append(min(t_sampa) / min(t_sam))
    return ratios


def run(args) -> dict:
    """2 gloo processes on the CPU, one thread each."""
    from sam_runner import distributed

    out = {}
    for kind, key in (("default", ""), ("resnet18", "_resnet18")):
        if args.quick and kind == "resnet18":
            continue
        rounds = 1 if args.quick else (max(args.repeats, 5) if kind == "default" else 3)
        calls = 5 if kind == "default" else 2
        ratios = distributed.launch(_probe, (kind, rounds, calls), 2, CPU)
        out[f"sampa_2proc_over_sam_step{key}"] = statistics.median(ratios)
    return out
