"""Functional-SAM: equal to a float64 transcription of the paper's update (torch.func: δ the
loss's derivative in the logits at θ, the descent J(θ+ε)ᵀ δ) over 30 steps, plain and
preconditioned; on a model linear in its parameters it is the base optimizer (no functional
path); micro-batches; a closure without reduce_loss is refused; bad keys."""

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, build, closure_for, flat, mlp, unflatten
from oracle_helpers import batches
from torch import nn
from torch.func import functional_call, vjp

from sam_runner.optim import VARIANTS


def _logits(model, vec, x):
    return functional_call(model, unflatten(model, vec), (x,))


def _functional_grad(model, theta, eps, x, y):
    """(g at θ, J(θ+ε)ᵀ δ) with δ = ∂ mean CE / ∂ logits at θ."""
    v = theta.detach().clone().requires_grad_(True)
    z = _logits(model, v, x)
    zl = z.detach().requires_grad_(True)
    (delta,) = torch.autograd.grad(F.cross_entropy(zl, y), zl)
    (g,) = torch.autograd.grad(F.cross_entropy(z, y), v)
    _, pullback = vjp(lambda w: _logits(model, w, x), theta + eps)
    return g, pullback(delta)[0]


def _reference(data, lr, rho, adam=False):
    model = mlp()
    theta = flat(model.parameters())
    m, v, buf, out = torch.zeros_like(theta), torch.zeros_like(theta), None, []
    b1, b2, adam_eps, wd = 0.9, 0.999, 1e-8, 1e-2
    for t, (x, y) in enumerate(data, start=1):
        g, _ = _functional_grad(model, theta, torch.zeros_like(theta), x, y)
        p = g if not adam or t == 1 else g / ((v / (1 - b2 ** (t - 1))).sqrt() + adam_eps)
        eps = rho * p / (p.norm() + 1e-12)
        _, d = _functional_grad(model, theta, eps, x, y)
        if adam:  # torch's AdamW, transcribed
            theta = theta * (1 - lr * wd)
            m, v = b1 * m + (1 - b1) * d, b2 * v + (1 - b2) * d * d
            mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
            theta = theta - lr * mhat / (vhat.sqrt() + adam_eps)
        else:
            buf = d.clone() if buf is None else 0.9 * buf + d
            theta = theta - lr * buf
        out.append(theta)
    return out


def test_functional_sam_equals_the_papers_update_over_30_steps():
    data = batches(30)
    model = mlp()
    opt = build("functional_sam", model, lr=0.05, momentum=0.9, rho=0.1)
    got = []
    for x, y in data:
        opt.step(closure_for(opt, model, x, y))
        got.append(flat(model.parameters()))
    want = _reference(data, lr=0.05, rho=0.1)
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 1e-10


def test_preconditioned_functional_sam_equals_the_papers_update_over_30_steps():
    data = batches(30)
    model = mlp()
    opt = VARIANTS["functional_sam"](
        model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=1e-2, rho=0.1,
        precondition="adam",
    ).bind(model=model)  # fmt: skip
    got = []
    for x, y in data:
        opt.step(closure_for(opt, model, x, y))
        got.append(flat(model.parameters()))
    want = _reference(data, lr=1e-3, rho=0.1, adam=True)
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 1e-10


def test_on_a_model_linear_in_its_parameters_it_is_the_base_optimizer():
    """J does not depend on θ: J(θ+ε)ᵀ δ(θ) = ∇L(θ), the plain step (SAM's would differ)."""
    torch.manual_seed(0)
    a = nn.Linear(6, 3).double()
    b = nn.Linear(6, 3).double()
    b.load_state_dict(a.state_dict())
    opt = build("functional_sam", a, lr=0.1, rho=0.5)
    sgd = torch.optim.SGD(b.parameters(), lr=0.1)
    for _ in range(3):
        opt.step(closure_for(opt, a))
        sgd.zero_grad()
        F.cross_entropy(b(X), Y).backward()
        sgd.step()
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-12, atol=1e-14)


def test_the_perturbed_pass_reports_the_perturbed_loss():
    model = mlp()
    opt = build("functional_sam", model, rho=0.1)
    theta = flat(model.parameters())
    opt.step(closure_for(opt, model))
    g, _ = _functional_grad(model, theta, torch.zeros_like(theta), X, Y)
    eps = 0.1 * g / g.norm()
    want = F.cross_entropy(_logits(model, theta + eps, X), Y)
    torch.testing.assert_close(opt.descent_loss, want, rtol=1e-12, atol=1e-14)


def test_a_closure_without_reduce_loss_is_refused():
    model = mlp()
    opt = build("functional_sam", model)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(X), Y)
        loss.backward()
        return loss

    with pytest.raises(ValueError, match="reduce_loss"):
        opt.step(closure)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(precondition="shampoo"), "precondition must be one of"),
        (dict(precondition="adam"), "adamw"),
    ],
)
def test_functional_sam_bad_keys(kw, message):
    with pytest.raises(ValueError, match=message):
        build("functional_sam", mlp(), **kw)  # SGD: no second moment to precondition with
