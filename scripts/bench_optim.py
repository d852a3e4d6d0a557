"""Bench section ``optim``: the cost of one optimizer step (all its passes) of every SAM
variant relative to SAM's, SAM's relative to the base step and to a plain per-parameter
loop implementation of the same formula. Ratios are measured side by side (alternating
calls, the fastest of a few per round, the median over rounds: see ``_ratios``) on the
default model (cnn1d on MNIST-1D-shaped input, batch 128) and on a CIFAR ResNet-18 at
batch 32, on one CPU thread (``--quick``: the default model only, one round). Every variant
is built as the runner builds it (its parameter groups, SGD with
momentum 0.9 and weight decay 5e-4; SAM-SPS without momentum).

Keys: ``<variant>_over_sam_step_default`` / ``..._resnet18``, ``sam_over_base_step_*``,
``sam_over_naive_step_*``, ``msam_over_base_step_*`` (MSAM takes one pass: its step against
the base's, the product of the two measured ratios).
"""

from __future__ import annotations

import copy
import statistics

import torch
import torch.nn.functional as F
from benchutil import median_time, single_threaded
from typing_extensions import override

from sam_runner.models import ResNet, SmallCNN
from sam_runner.optim import VARIANTS
from sam_runner.optim.build import parameter_groups


class NaiveSAM:
    """The same formula as SAM (ε = ρ g / ‖g‖) written the usual way: per-parameter loops."""

    def __init__(self, model, rho=0.05, **sgd):
        self.params = [p for p in model.parameters()]
        self.rho = rho
        self.base = torch.optim.SGD(self.params, **sgd)

    def zero_grad(self, set_to_none=True):
        self.base.zero_grad(set_to_none=set_to_none)

    @override
    def reduce_loss(self, per_sample, logits, targets):
        return per_sample.mean()

    def select_rows(self, *tensors):
        return tensors

    @torch.no_grad()
    def step(self, closure):
        with torch.enable_grad():
            loss = closure()
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in self.params]), 2)
        eps = []
        for p in self.params:
            e = p.grad * (self.rho / (norm + 1e-12))
            p.add_(e)
            eps.append(e)
        with torch.enable_grad():
            closure()
        for p, e in zip(self.params, eps):
            p.sub_(e)
        self.base.step()
        return loss


def _setup(kind):
    torch.manual_seed(0)
    if kind == "default":
        model, x = SmallCNN(1, 1, 10, 32), torch.randn(128, 1, 40)
    else:
        model, x = ResNet((2, 2, 2, 2), 3, 10), torch.randn(32, 3, 32, 32)
    return model, x, torch.randint(0, 10, (len(x),))


def _stepper(opt, model, x, y):
    def closure():
        opt.zero_grad(set_to_none=True)
        xs, ys = opt.select_rows(x, y)  # the runner's loop: all rows but in ESAM's descent pass
        out = model(xs)
        loss = opt.reduce_loss(F.cross_entropy(out, ys, reduction="none"), out, ys)
        loss.backward()
        return loss.detach()

    return lambda: opt.step(closure)


def _variant(name, model, x, y):
    model = copy.deepcopy(model)
    sgd = dict(lr=0.01, momentum=0.0 if name == "sam_sps" else 0.9, weight_decay=5e-4)
    opt = VARIANTS[name](parameter_groups(model), torch.optim.SGD, total_steps=10**6, **sgd).bind(
        model=model
    )
    return _stepper(opt, model, x, y)


def _ratios(fns: dict, ref, repeats: int, calls: int) -> dict:
    """Per round and variant: the fastest of ``calls`` variant steps over the fastest of ``calls``
    SAM steps, the two taken alternately (SAM, variant, SAM, variant, ...); the median of that
    ratio over ``repeats`` rounds. On this shared 2-core machine one step's time varies by ±20%
    from call to call (other tenants, not our code): the fastest of a few calls is the step's
    own cost, the alternation cancels slow drift, the median over rounds the rest."""
    for f in (ref, *fns.values()):
        f()  # warm up: allocations, first-step state
    rows = {name: [] for name in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            t_ref, t_f = [], []
            for _ in range(calls):
                t_ref.append(median_time(ref, 1, 0))
                t_f.append(median_time(f, 1, 0))
            rows[name].append(min(t_f) / min(t_ref))
    return {name: statistics.median(v) for name, v in rows.items()}


@single_threaded
def run(args) -> dict:
    """Single-threaded CPU (benchutil.single_threaded)."""
    kinds = ["default"] if args.quick else ["default", "resnet18"]
    out = {}
    for kind in kinds:
        model, x, y = _setup(kind)
        repeats = 1 if args.quick else (max(args.repeats, 5) if kind == "default" else 3)
        calls = 10 if kind == "default" else 3  # ResNet-18: ~4 s a step, 14 min for the section
        steps = {name: _variant(name, model, x, y) for name in VARIANTS}
        naive_model = copy.deepcopy(model)
        steps["naive"] = _stepper(
            NaiveSAM(naive_model, lr=0.01, momentum=0.9, weight_decay=5e-4), naive_model, x, y
        )
        sam = steps.pop("sam")
        for name, r in _ratios(steps, sam, repeats, calls).items():
            if name == "base":
                out[f"sam_over_base_step_{kind}"] = 1 / r
            elif name == "naive":
                out[f"sam_over_naive_step_{kind}"] = 1 / r
            else:
                out[f"{name}_over_sam_step_{kind}"] = r
        if f"msam_over_sam_step_{kind}" in out:
            out[f"msam_over_base_step_{kind}"] = (
                out[f"msam_over_sam_step_{kind}"] * out[f"sam_over_base_step_{kind}"]
            )
    return out
