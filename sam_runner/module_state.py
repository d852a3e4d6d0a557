"""Context managers over a model's modules: their train/eval flags, BatchNorm running
statistics, and the gradient synchronisation of a data-parallel model.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch.nn.modules.batchnorm import _BatchNorm

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from torch import nn


@contextlib.contextmanager
def modes_restored(model: nn.Module) -> Iterator[None]:
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
def frozen_running_stats(modules: Iterable[nn.Module]) -> Iterator[None]:
    """BatchNorm layers among ``modules`` normalise as their mode says (batch statistics in train
    mode) but update no running statistics until the context closes (an eval-mode pass inside
    reads them unchanged)."""
    tracked = [m for m in modules if isinstance(m, _BatchNorm) and m.track_running_stats]
    for m in tracked:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in tracked:
            m.track_running_stats = True


@contextlib.contextmanager
def running_stats_restored(modules: Iterable[nn.Module]) -> Iterator[None]:
    """BatchNorm layers among ``modules`` have their running statistics as before when the
    context closes: the passes inside (train mode: batch statistics) update them, and they are
    put back. For a training step's later passes: unlike ``frozen_running_stats`` no flag
    changes, so a compiled model runs them on the first pass's graph (no guard fails, no
    recompile)."""
    tracked = [
        m
        for m in modules
        if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None
    ]
    running = [b for m in tracked for b in (m.running_mean, m.running_var, m.num_batches_tracked)]
    kept = [b.clone() for b in running]
    try:
        yield
    finally:
        if running:
            torch._foreach_copy_(running, kept)


@contextlib.contextmanager
def gradients_skipped(params: Iterable[torch.Tensor]) -> Iterator[None]:
    """``params`` get no gradient until the context closes (``requires_grad`` off, so autograd
    skips their weight gradients, and whatever only they need), then have it back. Each is marked
    meanwhile, so that code asking whether a parameter is trained (``is_trainable``) still says
    yes."""
    skipped = [p for p in params if p.requires_grad]
    for p in skipped:
        p.requires_grad_(False)
        p._gradient_skipped = True
    try:
        yield
    finally:
        for p in skipped:
            p.requires_grad_(True)
            del p._gradient_skipped


@contextlib.contextmanager
def gradient_sync_paused(net: nn.Module) -> Iterator[None]:
    """The forwards and backwards run inside keep each process's gradients to itself: DDP's
    ``no_sync`` (no all-reduce), FSDP2's ``set_requires_gradient_sync(False)`` (no
    reduce-scatter: each process accumulates its own unsharded gradient until a synchronised
    backward reduces the sum). A model of one process has nothing to pause.

    Args:
        net: the model as the run trains it (a DDP module, an FSDP2-sharded module, or a plain
            one).
    """
    if hasattr(net, "no_sync"):
        with net.no_sync():
            yield
        return
    if not hasattr(net, "set_requires_gradient_sync"):
        yield
        return
    net.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        net.set_requires_gradient_sync(True)


def fsdp_param_groups(net: nn.Module) -> list:
    """FSDP2's parameter groups of ``net`` (one per ``fully_shard``), outermost first; none for a
    model that is not sharded."""
    from torch.distributed.fsdp import FSDPModule

    return [
        group
        for m in net.modules()
        if isinstance(m, FSDPModule)
        for group in m._get_fsdp_state()._fsdp_param_groups
    ]


def gathered_parameters(net: nn.Module) -> dict:
    """Each sharded parameter of ``net`` (FSDP2's DTensor, the optimizer's) -> the unsharded
    parameter FSDP2 gathers it into (the one forward and backward use while it is gathered)."""
    return {
        fp.sharded_param: fp.unsharded_param
        for group in fsdp_param_groups(net)
        for fp in group.fsdp_params
        if hasattr(fp, "_unsharded_param")  # made by the first all-gather
    }


@contextlib.contextmanager
def gathered_kept(net: nn.Module, through_forward: bool = False) -> Iterator[None]:
    """FSDP2 keeps the parameters it gathers, gathered, after each backward (and with
    ``through_forward`` after each forward too) until the context closes: a gathered parameter
    changed in place then stays what forward and backward use, none is gathered again from the
    shards. Their reshard is ``reshard_gathered``'s."""
    groups = fsdp_param_groups(net)
    saved = [(g.reshard_after_backward, g.post_forward_mesh_info) for g in groups]
    for g in groups:
        g.reshard_after_backward = False
        if through_forward:  # FSDP2's own setting for no reshard after forward (the root's)
            g.post_forward_mesh_info = None
    try:
        yield
    finally:
        for g, (after_backward, post_forward) in zip(groups, saved):
            g.reshard_after_backward, g.post_forward_mesh_info = after_backward, post_forward


def reshard_gathered(net: nn.Module) -> None:
    """Free every gathered parameter of ``net`` and put the shards back on the modules."""
    from torch.distributed.fsdp import FSDPModule

    for m in net.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


@contextlib.contextmanager
def own_forwards(model: nn.Module, replacement) -> Iterator[None]:
    """The modules of ``model`` whose instance ``forward`` is the function ``replacement`` (set
    per instance, as activation checkpointing and the fast forwards do) run their class's own
    forward until the context closes, then get ``replacement`` back."""
    replaced = [
        m
        for m in model.modules()
        if getattr(m.__dict__.get("forward"), "__func__", None) is replacement
    ]
    for m in replaced:
        del m.forward
    try:
        yield
    finally:
        for m in replaced:
            m.forward = replacement.__get__(m)


def is_trainable(p: torch.Tensor) -> bool:
    """Whether ``p`` is a trained parameter: it requires a gradient, or would but for a pass that
    skips it (``gradients_skipped``)."""
    return p.requires_grad or getattr(p, "_gradient_skipped", False)


def full_state(model) -> dict:
    """``model``'s state dict as whole tensors on the CPU (copies). A sharded model's (FSDP2's
    DTensors) is gathered tensor by tensor: every process of the run must call it."""
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach().cpu().clone()
    return out
