"""``trainer.compile``: torch.compile on any device (``trainer.compile_mode``: default,
reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs). The training pass
compiles ``ForwardLoss``, the forward and the per-example loss together, so one graph runs from
the inputs to the loss (its backward too); evaluation and the optimizer's BatchNorm rule see the
compiled model. On a CPU, inductor writes C++: without a compiler the run says so in one line and
runs eagerly."""

from __future__ import annotations

import os
import shutil
import sys

import torch

from .fast_path import resolved_precision
from .lengths import DTYPES

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here, or None when it can.

    Args:
        device: the run's device; only a CPU needs something besides torch (a C++ compiler).
    """
    if device.type != "cpu":
        return None
    names = [os.environ.get("CXX") or "g++", "c++", "clang++"]
    if any(shutil.which(n) for n in names):
        return None
    return "no C++ compiler for inductor on the CPU (g++, c++, clang++ or $CXX)"


def compiled(net: torch.nn.Module, mode: str, device: torch.device) -> torch.nn.Module:
    """``net`` compiled in ``mode`` (one of ``COMPILE_MODES``), or ``net`` itself with a notice
    when this machine cannot compile for ``device``.

    Args:
        net: the model as the passes call it (DDP-wrapped or sharded already).
        mode: ``trainer.compile_mode``.
        device: the run's device.
    """
    why = compiler_missing(device)
    if why is not None:
        print(
            f"sam-run: notice: trainer.compile=true: {why}; the model runs eagerly",
            file=sys.stderr,
            flush=True,
        )
        return net
    return torch.compile(net, mode=None if mode == "default" else mode)


class ForwardLoss:
    """The training pass's forward, under the run's autocast, and its per-example loss
    (outside autocast, as an eager run computes it): ``(logits, per_sample)``. The loop calls it
    eagerly, or compiled (``compiled_forward_loss``), where one graph holds both."""

    def __init__(self, net: torch.nn.Module, criterion, device: torch.device, precision: str):
        """
        Args:
            net: the model as the passes call it (DDP-wrapped or sharded; not compiled).
            criterion: ``(logits, targets) -> per-example losses``.
            device: the run's device (the autocast's device type).
            precision: ``trainer.precision`` (``auto`` resolved here, once).
        """
        self.net, self.criterion, self.device_type = net, criterion, device.type
        self.dtype = DTYPES[resolved_precision(precision, device)]

    def __call__(self, x: torch.Tensor, target: torch.Tensor):
        if self.dtype is None:
            out = self.net(x)
        else:  # entered inside the function: a compiled graph traces the autocast region
            with torch.autocast(self.device_type, dtype=self.dtype):
                out = self.net(x)
        return out, self.criterion(out, target)


def compiled_forward_loss(forward_loss: ForwardLoss, mode: str, backend: str = "inductor"):
    """``forward_loss`` under ``torch.compile``: logits and loss in one graph.

    Args:
        forward_loss: the loop's eager ``ForwardLoss``.
        mode: ``trainer.compile_mode``.
        backend: torch.compile's backend (the tests' ``aot_eager`` generates no code).
    """
    options = {} if backend != "inductor" else {"mode": None if mode == "default" else mode}
    return torch.compile(forward_loss, backend=backend, **options)
