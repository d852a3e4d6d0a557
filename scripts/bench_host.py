"""Bench section ``host`` (python scripts/bench.py --only host): the host's work per step, with
the compute made ≈ 0 (one Linear layer, 40 → 10, on batches of 32 of the default data), one
thread; each step of the runner is the body of its epoch loop (``gpu_parts.Stepper``, which runs
``EpochLoop.train_step``: the loader's batch, the optimizer step with its closure and passes, the
scheduler, the epoch's loss and accuracy sums, the parts' hooks and the loop's checks).

host_step_over_bare     the runner's base step (optimizer=base, SGD) over a bare loop on the
                        same model and data tensors (a seeded permutation, index_select, forward,
                        cross-entropy, zero_grad, backward, SGD.step); target ≤ 1.3
host_sam_over_davda54   the runner's SAM step over davda54/sam's loop (bench_memory.Davda54SAM:
                        forward-backward, first_step, forward-backward, second_step) on the same
                        batches; target ≤ 1.1
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from benchutil import interleaved_ratio, set_up_run, single_threaded

ONE_LAYER = ("model=mlp", "model.hidden=[]", "dataset.batch_size=32",
             "metrics.hessian.enabled=false", "scheduler=constant")  # fmt: skip
SGD = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)


class BareLoop:
    """The least a training loop does per step on tensors held in memory."""

    def __init__(self, run, sam: bool):
        from bench_memory import Davda54SAM

        self.model = copy.deepcopy(run.model)
        self.x, self.y = run.data.train.x, run.data.train.y
        self.batch, self.i = 32, 0
        self.order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(0))
        params = self.model.parameters()
        self.sam = sam
        self.opt = Davda54SAM(params, torch.optim.SGD, rho=0.05, **SGD) if sam else (
            torch.optim.SGD(params, **SGD)
        )  # fmt: skip

    def step(self):
        if (self.i + 1) * self.batch > len(self.order):
            self.i = 0
        idx = self.order[self.i * self.batch : (self.i + 1) * self.batch]
        self.i += 1
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        if self.sam:
            F.cross_entropy(self.model(x), y).backward()
            self.opt.first_step(zero_grad=True)
            F.cross_entropy(self.model(x), y).backward()
            self.opt.second_step(zero_grad=True)
            return
        self.opt.zero_grad()
        F.cross_entropy(self.model(x), y).backward()
        self.opt.step()


@single_threaded
def run(args) -> dict:
    from gpu_parts import Stepper

    repeats = 3 if args.quick else max(args.repeats, 7)
    steps = 50 if args.quick else 200
    out = {}
    for name, variant in (("host_step_over_bare", "base"), ("host_sam_over_davda54", "sam")):
        runner = set_up_run(*ONE_LAYER, f"optimizer={variant}", "base_optimizer=sgd")
        ours, bare = Stepper(runner, None), BareLoop(runner, sam=variant == "sam")
        out[name] = interleaved_ratio(
            lambda o=ours: [o.step() for _ in range(steps)],
            lambda b=bare: [b.step() for _ in range(steps)],
            repeats,
        )
    return out
