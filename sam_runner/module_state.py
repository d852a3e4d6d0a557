"""Context managers over a model's modules: their train/eval flags, and BatchNorm running
statistics.
"""

from __future__ import annotations

import contextlib

from torch.nn.modules.batchnorm import _BatchNorm


@contextlib.contextmanager
def modes_restored(model):
    """Every module's own train/eval flag back afterwards (``model.train(was)`` would set all
    alike).
    """
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def frozen_running_stats(modules):
    """BatchNorm layers among ``modules`` normalise as their mode says (batch statistics in train
    mode) but update no running statistics until the context closes."""
    tracked = [m for m in modules if isinstance(m, _BatchNorm) and m.track_running_stats]
    for m in tracked:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in tracked:
            m.track_running_stats = True
