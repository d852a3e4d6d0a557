"""EISAM: predict θ̃ = θ − γ g, ε from ∇L(θ̃), descent gradient at θ̃ + ε applied at θ; 3 passes."""

import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad


def test_eisam_matches_the_formula():
    model, lr, rho = mlp(), 0.1, 0.05
    opt = build("eisam", model, lr=lr, rho=rho)
    theta, seen, calls = flat(model.parameters()), {}, []
    opt.step(closure_for(opt, model, record=seen, calls=calls))
    assert calls == [0, 1, 2]
    _, g = ref_grad(model, theta)
    predicted = theta - lr * g  # γ defaults to the learning rate
    torch.testing.assert_close(seen[1], predicted, rtol=1e-9, atol=1e-12)
    _, g_hat = ref_grad(model, predicted)
    eps = rho * g_hat / g_hat.norm()
    torch.testing.assert_close(seen[2], predicted + eps, rtol=1e-9, atol=1e-12)
    _, d = ref_grad(model, predicted + eps)
    torch.testing.assert_close(flat(model.parameters()), theta - lr * d, rtol=1e-9, atol=1e-12)


def test_eisam_predict_lr_overrides_the_learning_rate():
    model = mlp()
    opt = build("eisam", model, lr=0.1, predict_lr=0.3)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    torch.testing.assert_close(seen[1], theta - 0.3 * g, rtol=1e-9, atol=1e-12)
