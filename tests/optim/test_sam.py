"""SAM and the shared update path against the formula, computed independently."""

import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad


def test_sam_perturbation_and_update_match_the_formula():
    model = mlp()
    opt = build("sam", model, lr=0.1, rho=0.07)
    theta = flat(model.parameters())
    seen = {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = 0.07 * g / g.norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    assert abs((seen[1] - theta).norm().item() - 0.07) < 1e-12  # ‖ε‖ = ρ
    _, d = ref_grad(model, theta + eps)
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * d, rtol=1e-9, atol=1e-12)
