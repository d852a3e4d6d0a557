"""``trainer.compile``: the model under ``torch.compile`` on any device (``trainer.compile_mode``:
default, reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs). On a CPU,
inductor writes C++: without a compiler the run says so in one line and runs eagerly."""

from __future__ import annotations

import os
import shutil
import sys

import torch

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
