"""GCSAM: equal to pytorch_optimizer's SAM(use_gc=True) in its configuration (float64, 30 steps),
the paper's form against its formula, bad keys."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad
from oracle_helpers import library_norm_in_float64, max_difference  # noqa: F401

from sam_runner.optim.gcsam import centralize_

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")


def _library_step(lib, closure):
    closure()
    lib.step(closure)


@pytest.mark.usefixtures("library_norm_in_float64")
@pytest.mark.parametrize(
    "base, base_kw",
    [
        (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=5e-4)),
        (torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2)),
    ],
    ids=["sgd", "adamw"],
)
def test_gcsam_raw_equals_pytorch_optimizer_sam_with_gc(base, base_kw):
    worst = max_difference(
        "gcsam",
        lambda model: pytorch_optimizer.SAM(
            model.parameters(), base, rho=0.1, use_gc=True, **base_kw
        ),
        _library_step,
        base,
        base_kw,
        rho=0.1,
        gc_norm="raw",
        gc_descent=False,
    )
    assert worst <= 1e-10


def _gc(model, vec):
    """GC of a flat vector, tensor by tensor (mean over all dimensions but the first)."""
    out, i = [], 0
    for p in model.parameters():
        t = vec[i : i + p.numel()].view_as(p)
        out.append((t - t.mean(dim=tuple(range(1, t.ndim)), keepdim=True)) if t.ndim > 1 else t)
        i += p.numel()
    return torch.cat([t.reshape(-1) for t in out])


def test_gcsam_default_is_the_papers_step():
    model, lr, rho = mlp(), 0.1, 0.05
    opt = build("gcsam", model, lr=lr, rho=rho)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    gc = _gc(model, g)
    eps = rho * gc / gc.norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-10, atol=1e-13)
    _, gs = ref_grad(model, theta + eps)
    torch.testing.assert_close(
        flat(model.parameters()), theta - lr * _gc(model, gs), rtol=1e-10, atol=1e-13
    )


def test_centralization_leaves_vectors_and_zeroes_each_output_channels_mean():
    w, b = torch.randn(4, 3, 2, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    w0, b0 = w.clone(), b.clone()
    centralize_([w, b])
    assert torch.equal(b, b0)
    torch.testing.assert_close(w.mean(dim=(1, 2)), torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(w - w0, -w0.mean(dim=(1, 2), keepdim=True).expand_as(w))


def test_gcsam_bad_norm():
    with pytest.raises(ValueError, match="gc_norm must be one of"):
        build("gcsam", mlp(), gc_norm="l1")
