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


def test_csam_on_token_windows_weighs_each_window_by_its_tokens_mean_weight():
    """A sequence model's [B, T, V] logits: the weight of a window (one per-sample loss) is the
    mean of its tokens' (1 − p_y)^γ, renormalised to mean 1 over the windows."""
    from sam_runner.losses import per_example

    torch.manual_seed(0)
    vocab, gamma, lr, rho = 5, 2.0, 0.1, 0.05
    model = torch.nn.Embedding(vocab, vocab).double()  # logits of the next token: [B, T, V]
    x, y = torch.randint(0, vocab, (6, 4)), torch.randint(0, vocab, (6, 4))
    per_window = per_example("cross_entropy")
    opt = build("csam", model, lr=lr, rho=rho, gamma=gamma)
    theta = flat(model.parameters())

    def closure():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = opt.reduce_loss(per_window(out, y), out, y)
        loss.backward()
        return loss.detach()

    opt.step(closure)
    w0 = theta.view(vocab, vocab).clone().requires_grad_(True)
    (g,) = torch.autograd.grad(per_window(w0[x], y).mean(), w0)
    v = (w0.detach() + rho * g / g.norm()).requires_grad_(True)
    out = v[x]
    p_true = torch.softmax(out, -1).gather(-1, y[..., None]).squeeze(-1)
    w = ((1 - p_true) ** gamma).mean(dim=1).detach()
    (d,) = torch.autograd.grad((w / w.mean() * per_window(out, y)).mean(), v)
    torch.testing.assert_close(flat(model.parameters()), theta - lr * d.reshape(-1))
