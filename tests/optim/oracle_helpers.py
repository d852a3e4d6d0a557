"""Running one of our variants beside a library's implementation on twin float64 models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, closure_for, flat, mlp

from sam_runner.optim import VARIANTS


def plain_closure(opt, model, x=X, y=Y):
    """The library convention: zero the gradients, loss, backward, return the loss."""

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return closure


def batches(steps, seed=3):
    """A different batch each step (the state the variants carry meets new data)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(16, 6, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (16,), generator=g),
        )
        for _ in range(steps)
    ]


def max_difference(name, make_library, library_step, base, base_kw, steps=30, **kw):
    """max |θ_ours − θ_library| over ``steps`` steps on new batches: our variant ``name`` with
    keywords ``kw`` and the library's, ``make_library(model)``, both over ``base(**base_kw)``."""
    ours, theirs = mlp(), mlp()
    opt = VARIANTS[name](ours.parameters(), base, **kw, **base_kw).bind(model=ours)
    lib = make_library(theirs)
    worst = 0.0
    for x, y in batches(steps):
        opt.step(closure_for(opt, ours, x, y))
        library_step(lib, plain_closure(lib, theirs, x, y))
        worst = max(worst, float((flat(ours.parameters()) - flat(theirs.parameters())).abs().max()))
    return worst


def float64_norm(param_groups, _device=None, *, weight_adaptive=False):
    """pytorch_optimizer's ``get_global_gradient_norm`` (the squared global norm, as a [1]
    tensor) without its cast to float32: the library rounds ‖g‖ to float32 (a relative 6e-8),
    which alone moves float64 trajectories by about 1e-9 over 30 steps. With this twin the
    comparison isolates the algorithm."""
    grads = [
        p.grad * (p.abs() if weight_adaptive and g.get("adaptive", False) else 1)
        for g in param_groups
        for p in g["params"]
        if p.grad is not None
    ]
    return torch.stack([t.norm() for t in grads]).square().sum().reshape(1)


@pytest.fixture
def library_norm_in_float64(monkeypatch):
    import pytorch_optimizer.optimizer.sam as library

    monkeypatch.setattr(library, "get_global_gradient_norm", float64_norm)
