"""Bench section: the cost of the training objectives beside the plain loss (python
scripts/bench.py --only objectives).

jsd_over_plain_step          one SAM step (two passes) with regularizer=jsd space=parameter
                             over the same step without it: a 3-layer MLP of width 256 on a
                             batch of 128 MNIST-1D-shaped inputs, on the CPU; side by side,
                             alternating, median of the repeats (the term's cost is one more
                             forward and its backward per pass)
jsd_input_over_plain_step    the same with space=input
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from benchutil import interleaved_ratio
from torch import nn

from sam_runner.optim import SAM
from sam_runner.regularizers import NoRegularizer, SkewJSD


def stepper(regularizer):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))  # fmt: skip
    opt = SAM(net.parameters(), torch.optim.SGD, lr=0.01, rho=0.05, total_steps=10**9)
    opt.bind(model=net)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, 40, generator=g), torch.randint(0, 10, (128,), generator=g)

    def closure():
        opt.zero_grad(set_to_none=True)
        out = net(x)
        loss = opt.reduce_loss(F.cross_entropy(out, y, reduction="none"), out, y)
        regularizer.add(loss, net, x, out, 1.0).backward()
        return loss.detach()

    return lambda: opt.step(closure)


def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    plain = stepper(NoRegularizer())
    out = {}
    for key, space in (
        ("jsd_over_plain_step", "parameter"),
        ("jsd_input_over_plain_step", "input"),
    ):
        jsd = stepper(SkewJSD(alpha=0.5, weight=1.0, space=space, radius=0.05))
        out[key] = interleaved_ratio(jsd, plain, repeats, warmup=2, inner=5)
    return out
