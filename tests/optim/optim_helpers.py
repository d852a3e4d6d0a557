"""Helpers for the optimizer tests: tiny float64 models, closures, and an independent
reference of "loss and gradient at a flat parameter vector" (torch.func), so that the
tests compute each formula themselves instead of calling the variants' helpers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from sam_runner.optim import VARIANTS

X = torch.randn(16, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))

# per-variant keywords that make each one valid with plain SGD (SAM-SPS: no momentum)
DEFAULT_KW = {name: {} for name in VARIANTS}
DEFAULT_KW["bsam"] = dict(num_data=1000)  # with its weight noise (null: none)


def mlp(seed=0, bias=True, depth=3, width=5):
    torch.manual_seed(seed)
    dims = [6] + [width] * (depth - 1)
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b, bias=bias), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(dims[-1], 3, bias=bias)).double()


def bn_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).double()


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def params_of(model):
    return [p for p in model.parameters()]


def unflatten(model, vec):
    out, i = {}, 0
    for name, p in model.named_parameters():
        out[name] = vec[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out


def ref_loss(model, vec, x=X, y=Y, per_sample=False):
    logits = functional_call(model, unflatten(model, vec), (x,))
    ls = F.cross_entropy(logits, y, reduction="none")
    return (ls, logits) if per_sample else ls.mean()


def ref_grad(model, vec, x=X, y=Y):
    """(L, ∇L) at the flat vector ``vec``, computed independently of any optimizer."""
    v = vec.detach().clone().requires_grad_(True)
    loss = ref_loss(model, v, x, y)
    (g,) = torch.autograd.grad(loss, v)
    return loss.detach(), g


def closure_for(opt, model, x=X, y=Y, record=None, calls=None, micro=1, costs=None):
    """The LBFGS-convention closure the runner uses (select_rows, reduce_loss, micro-batches);
    optionally records the parameters seen by each pass, counts calls, and records what each
    call cost as observed: the share of the batch's rows it ran on, a third of that when no
    parameter required a gradient (a forward without backward)."""

    def closure():
        if calls is not None:
            calls.append(opt.pass_index)
        if record is not None:
            record[opt.pass_index] = flat(model.parameters())
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64)
        chunks = [opt.select_rows(xm, ym) for xm, ym in zip(x.chunk(micro), y.chunk(micro))]
        chunks = [(xm, ym) for xm, ym in chunks if len(ym)]
        rows = sum(len(ym) for _, ym in chunks)
        if costs is not None:
            grads_flow = any(p.requires_grad for p in model.parameters())
            costs.append(rows / len(y) * (1 if grads_flow else 1 / 3))
        for xm, ym in chunks:
            out = model(xm)
            per_sample = F.cross_entropy(out, ym, reduction="none")
            loss = opt.reduce_loss(per_sample, out, ym) * (len(ym) / rows)
            loss.backward()
            total += loss.detach()
        return total

    return closure


def build(name, model, lr=0.1, momentum=0.0, groups=None, **kw):
    cls = VARIANTS[name]
    params = groups if groups is not None else list(model.parameters())
    kw = {"total_steps": 100, **DEFAULT_KW[name], **kw}
    opt = cls(params, torch.optim.SGD, lr=lr, momentum=momentum, **kw)
    return opt.bind(model=model)
