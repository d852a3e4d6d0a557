"""Activation checkpointing (``trainer.activation_checkpointing``): a block's activations
recomputed in the backward pass instead of kept (``torch.utils.checkpoint``, non-reentrant, the
RNG state kept so dropout draws alike; BatchNorm running statistics restored after the
recompute so that they move once a pass). The ground floor: the trainer sets it on a model's
blocks (``training.strategy.wrap``), the curvature measurement pauses it
(``metrics.sharded``)."""

from __future__ import annotations

import contextlib
import types

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .module_state import own_forwards


class RunningStatsKept:
    """BatchNorm running statistics of the training-mode ``modules`` as they were, after each
    use as a context (a recompute must not move them a second time). Enterable again and again:
    a graph kept for several backwards (the curvature measurement's cached graphs) recomputes
    once per backward, entering the same context each time."""

    def __init__(self, modules):
        self.modules = list(modules)
        self._saved = []

    def __enter__(self):
        self._saved = [
            (m, [b.detach().clone() for b in m.buffers(recurse=False)])
            for m in self.modules
            if isinstance(m, _BatchNorm) and m.training and m.track_running_stats
        ]
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for m, values in self._saved:
                for b, v in zip(m.buffers(recurse=False), values):
                    b.copy_(v)
        self._saved = []


def _checkpointed_forward(self, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint

    norms = [m for m in self.modules() if isinstance(m, _BatchNorm)]
    forward = types.MethodType(type(self).forward, self)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(
        forward,
        *args,
        use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), RunningStatsKept(norms)),
        **kwargs,
    )


def checkpoint_activations(block) -> None:
    """Recompute ``block``'s activations in the backward pass (its names and parameters are
    unchanged: the checkpoint replaces only its instance's ``forward``)."""
    block.forward = types.MethodType(_checkpointed_forward, block)


def checkpointing_paused(model):
    """The blocks of ``model`` that ``checkpoint_activations`` set run their own forward
    meanwhile, keeping their activations: for passes through ``functional_call``, whose
    parameters are gone by the time a backward would recompute."""
    return own_forwards(model, _checkpointed_forward)
