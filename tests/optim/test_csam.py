"""CSAM: descent loss at θ+ε weighted by (1 − p_y)^γ renormalised to mean 1; γ = 0 is SAM."""

import pytest
import torch
from optim_helpers import X, Y, build, closure_for, flat, mlp, ref_grad, ref_loss


def test_csam_matches_the_formula():
    model, lr, rho, gamma = mlp(), 0.1, 0.05, 2.0
    opt = build("csam", model, lr=lr, rho=rho, gamma=gamma)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = rho * g / g.norm()  # SAM's ε from the plain loss
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    v = (theta + eps).clone().requires_grad_(True)
    per_sample, logits = ref_loss(model, v, per_sample=True)
    p_true = torch.softmax(logits, 1)[torch.arange(len(Y)), Y]
    w = ((1 - p_true) ** gamma).detach()
    w = w / w.mean()
    (d,) = torch.autograd.grad((w * per_sample).mean(), v)
    torch.testing.assert_close(flat(model.parameters()), theta - lr * d, rtol=1e-9, atol=1e-12)


def test_csam_with_gamma_zero_is_sam():
    a, b = mlp(), mlp()
    csam, sam = build("csam", a, lr=0.1, gamma=0.0), build("sam", b, lr=0.1)
    for _ in range(3):
        csam.step(closure_for(csam, a))
        sam.step(closure_for(sam, b))
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=0, atol=0)


def test_csam_needs_reduce_loss_in_the_closure():
    model = mlp()
    opt = build("csam", model, lr=0.1)

    def plain():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X), Y)
        loss.backward()
        return loss

    with pytest.raises(ValueError, match="reduce_loss"):
        opt.step(plain)
