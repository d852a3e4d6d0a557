"""No optimizer step waits on the host (#57): every variant's step, on the runner's parameter
groups, makes no call that reads a tensor on the host or copies it between devices (each a
stream synchronisation on CUDA), counted by a TorchFunctionMode over three steps; the variants
that need one say so (``HOST_READS``, with the reason)."""

from __future__ import annotations

import pytest
import torch
from optim_helpers import DEFAULT_KW, bn_net, build, closure_for

from sam_runner.optim import VARIANTS
from sam_runner.optim.build import parameter_groups

# variant -> why its step reads the host (documented in docs/variants.md)
HOST_READS: dict[str, str] = {}


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts what synchronises a device with the host: reading a value (``item``, ``tolist``,
    ``bool``, ``float``, ``int``), a copy between devices (``to``/``copy_`` across devices,
    ``cpu``, ``cuda``), and the calls whose output size depends on values (``nonzero``, boolean
    mask indexing, ``masked_select``, ``unique``)."""

    READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "cuda",
             "nonzero", "masked_select", "unique", "argwhere"}  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.calls.append(name)
        elif name == "__getitem__" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
        ):
            self.calls.append("mask indexing")
        elif name == "to" and any(isinstance(a, (torch.device, str)) for a in args[1:]):
            self.calls.append("to")
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_step_reads_nothing_on_the_host(name):
    model = bn_net()
    opt = build(name, model, lr=0.05, groups=parameter_groups(model), **DEFAULT_KW[name])
    closure = closure_for(opt, model)
    opt.step(closure)  # the first step builds the lists and buffers
    with HostReads() as reads:
        for _ in range(3):
            opt.step(closure)
    if name in HOST_READS:
        assert reads.calls, f"{name} reads nothing on the host: drop it from HOST_READS"
    else:
        assert reads.calls == [], (name, reads.calls)


# schedule -> its keys; adaptive (AE-SAM) reads ‖g‖ against its running statistics on the host
SCHEDULES = {
    "every": dict(interval=2),
    "random": dict(perturb_prob=0.5),
    "late": dict(perturb_from=2, steps_per_epoch=1),
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_a_scheduled_step_reads_nothing_on_the_host(schedule):
    model = bn_net()
    kw = dict(perturb_schedule=schedule, **SCHEDULES[schedule])
    opt = build("sam", model, lr=0.05, groups=parameter_groups(model), **kw)
    closure = closure_for(opt, model)
    opt.step(closure)
    with HostReads() as reads:
        for _ in range(4):
            opt.step(closure)
    assert reads.calls == [], (schedule, reads.calls)


def test_esams_faithful_rule_is_the_documented_host_read():
    """ESAM's per-tensor rule (faithful=true) keeps a number of rows that depends on the
    values: one read per step (docs/variants.md); its default rule reads nothing (above)."""
    model = bn_net()
    opt = build("esam", model, lr=0.05, groups=parameter_groups(model), faithful=True)
    closure = closure_for(opt, model)
    opt.step(closure)
    with HostReads() as reads:
        opt.step(closure)
    assert "__int__" in reads.calls
