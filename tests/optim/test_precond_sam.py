"""PrecondSAM: ε = ρ U g / sqrt(gᵀ U g), U = 1/(F + δ), F an EMA of g² refreshed every K steps."""

import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad


def test_precond_sam_matches_the_formula_over_refreshes():
    model, rho, lr, beta, delta = mlp(), 0.05, 0.1, 0.95, 1e-8
    opt = build("precond_sam", model, lr=lr, rho=rho, refresh_every=2, beta=beta)
    theta, fisher = flat(model.parameters()), None
    for step in range(5):
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        _, g = ref_grad(model, theta)
        if step % 2 == 0:  # refresh on perturbing steps 1, 3, 5 (the first sets F = g²)
            fisher = g**2 if fisher is None else beta * fisher + (1 - beta) * g**2
        u = 1 / (fisher + delta)
        u = u / u.mean()  # normalised to mean 1 (the project's choice)
        eps = rho * u * g / (g * u * g).sum().sqrt()
        torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-8, atol=1e-12)
        _, d = ref_grad(model, theta + eps)
        theta = theta - lr * d
    torch.testing.assert_close(flat(model.parameters()), theta, rtol=1e-8, atol=1e-12)


def test_precond_sam_with_a_flat_preconditioner_is_sam():
    """δ ≫ F makes U = I after normalisation: ε is SAM's."""
    a, b = mlp(), mlp()
    pre, sam = build("precond_sam", a, lr=0.1, delta=1e12), build("sam", b, lr=0.1)
    for _ in range(3):
        sa, sb = {}, {}
        pre.step(closure_for(pre, a, record=sa))
        sam.step(closure_for(sam, b, record=sb))
        torch.testing.assert_close(sa[1], sb[1], rtol=1e-9, atol=1e-12)
