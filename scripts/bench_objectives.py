"""Bench section: the cost of the training objectives beside the plain loss (python
scripts/bench.py --only objectives).

jsd_over_plain_step          one SAM step (two passes) of the runner's default model (the cnn1d
                             of MNIST-1D, batch 128) with regularizer=jsd space=parameter over
                             the same step without it, on the CPU; side by side, alternating,
                             median of the repeats (the term's cost is one more forward and its
                             backward per pass)
jsd_input_over_plain_step    the same with space=input
jsd_detached_over_plain_step, jsd_input_detached_over_plain_step  the same with
                             regularizer.detach=true (one more forward per pass, no backward)
*_mlp                        each of these on a 3-layer MLP of width 256 (40-d inputs), whose
                             passes are so small that fixed costs per operation weigh
ouidecay_over_constant_step  256 SAM steps (one rescale interval at the default
                             weight_decay.every_n_steps, epochs of 32 steps) of a cnn1d
                             (MNIST-1D's default model) under weight_decay=ouidecay over the same
                             steps under constant: the hooks, the collected steps' counts and
                             all-reduce, the rescale
distill_over_plain_step      one SAM step of the runner's default model (the cnn1d of
                             MNIST-1D, batch 128) with trainer.distill (a teacher of the same
                             shape: one forward per step, no_grad) over the plain step
distill_align_over_plain_step  the same with the layer alignment (align > 0)
distill_over_plain_step_mlp  the same on the MLP above, whose passes are so small that the
distill_align_over_plain_step_mlp  term's fixed cost per operation weighs (the worst case)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from benchutil import interleaved_ratio
from torch import nn

from sam_runner import distributed
from sam_runner.clock import Clock
from sam_runner.distill import Distiller
from sam_runner.models import build_model
from sam_runner.optim import SAM
from sam_runner.optim.build import parameter_groups
from sam_runner.part import Parts, PassInputs
from sam_runner.regularizers.jsd import SkewJSD
from sam_runner.weight_decay import OUIDecay


def mlp():
    return nn.Sequential(nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))  # fmt: skip


def default_model():
    """The runner's default model (``model=cnn1d`` on MNIST-1D's 1 x 40 inputs)."""
    from omegaconf import OmegaConf

    return build_model(OmegaConf.create({"arch": "cnn1d", "channels": 32}), (1, 40), 10)


MODELS = {"mlp": (mlp, (40,)), "default": (default_model, (1, 40))}


def stepper(regularizer=None, distill=None, kind="mlp"):
    """SAM steps of a model with the run's parts (a distillation, a regularizer: None, none)
    hooked as the training loop hooks them."""
    build, shape = MODELS[kind]
    torch.manual_seed(0)
    net = build()
    opt = SAM(net.parameters(), torch.optim.SGD, lr=0.01, rho=0.05, total_steps=10**9)
    opt.bind(model=net)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, *shape, generator=g), torch.randint(0, 10, (128,), generator=g)
    parts = Parts([p for p in (distill(net) if distill else None, regularizer) if p is not None])

    def closure():
        opt.zero_grad(set_to_none=True)
        with parts.forward_context(opt.pass_index):
            out = net(x)
        loss = opt.reduce_loss(F.cross_entropy(out, y, reduction="none"), out, y)
        parts.loss(loss, PassInputs(net, x, out, 0, 1.0, None)).backward()
        return loss.detach()

    def step():
        parts.call("begin_step", [(x,)])
        return opt.step(closure)

    return step


def teacher_of(align, kind="mlp"):
    torch.manual_seed(1)
    teacher = MODELS[kind][0]().eval().requires_grad_(False)
    return lambda student: Distiller(teacher, student, 4.0, 0.5, align)


def decay_stepper(rule, steps=256):
    """``steps`` SAM steps of a cnn1d under a weight-decay rule, as the trainer runs them."""
    from omegaconf import OmegaConf

    torch.manual_seed(0)
    net = build_model(OmegaConf.create({"arch": "cnn1d", "channels": 32}), (1, 40), 10)
    groups = rule.param_groups(parameter_groups(net), net) if rule else parameter_groups(net)
    opt = SAM(groups, torch.optim.SGD, lr=0.01, momentum=0.9, weight_decay=5e-4, rho=0.05,
              total_steps=10**9)  # fmt: skip
    opt.bind(model=net)
    clock = Clock()
    clock.total_steps = 10**9
    if rule:
        rule.bind(net, opt, distributed.current(), 0, clock, 32)
    parts = Parts([rule] if rule else [])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, 1, 40, generator=g), torch.randint(0, 10, (128,), generator=g)

    def closure():
        opt.zero_grad(set_to_none=True)
        with parts.forward_context(opt.pass_index):
            out = net(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        return loss.detach()

    def run_steps():
        for _ in range(steps):
            opt.step(closure)
            clock.step += 1
            parts.call("after_step", clock.step)

    return run_steps


def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    out = {}
    for kind, suffix in (("default", ""), ("mlp", "_mlp")):
        plain = stepper(kind=kind)
        for key, space, detach in (
            ("jsd_over_plain_step", "parameter", False),
            ("jsd_input_over_plain_step", "input", False),
            ("jsd_detached_over_plain_step", "parameter", True),
            ("jsd_input_detached_over_plain_step", "input", True),
        ):
            term = SkewJSD(alpha=0.5, weight=1.0, space=space, radius=0.05, detach=detach)
            jsd = stepper(term, kind=kind)
            out[key + suffix] = interleaved_ratio(jsd, plain, repeats, warmup=2, inner=5)
    for kind, suffix in (("default", ""), ("mlp", "_mlp")):
        untaught = stepper(kind=kind)
        for key, align in (
            ("distill_over_plain_step", 0.0),
            ("distill_align_over_plain_step", 1.0),
        ):
            taught = stepper(None, teacher_of(align, kind), kind)
            out[key + suffix] = interleaved_ratio(taught, untaught, repeats, warmup=2, inner=5)
    steps = 64 if args.quick else 256
    out["ouidecay_over_constant_step"] = interleaved_ratio(
        decay_stepper(OUIDecay(), steps), decay_stepper(None, steps), repeats, warmup=1
    )
    return out
