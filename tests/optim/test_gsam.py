"""GSAM: descent ∇L(θ+ε) − α g⊥, ρ following the learning rate; α = 0 is SAM."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad


def test_gsam_matches_the_formula():
    model, lr, rho, alpha = mlp(), 0.1, 0.05, 0.3
    opt = build("gsam", model, lr=lr, rho=rho, alpha=alpha)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = rho * g / g.norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    _, gp = ref_grad(model, theta + eps)
    g_perp = g - (g @ gp) / (gp @ gp) * gp
    assert abs((g_perp @ gp).item()) < 1e-12
    torch.testing.assert_close(
        flat(model.parameters()), theta - lr * (gp - alpha * g_perp), rtol=1e-9, atol=1e-12
    )


def test_gsam_with_alpha_zero_is_sam():
    a, b = mlp(), mlp()
    gsam, sam = build("gsam", a, lr=0.1, alpha=0.0), build("sam", b, lr=0.1)
    for _ in range(3):
        gsam.step(closure_for(gsam, a))
        sam.step(closure_for(sam, b))
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=0, atol=0)


def test_gsam_rho_follows_the_learning_rate():
    model = mlp()
    opt = build("gsam", model, lr=0.2, rho=0.05, rho_schedule="lr")
    for g in opt.param_groups:
        g["lr"] = 0.05
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    assert (seen[1] - theta).norm().item() == pytest.approx(0.05 * 0.05 / 0.2, rel=1e-9)


def test_gsam_rho_follows_the_learning_rate_by_default():
    """The Python API's default is the spec's (ρ scaled with the lr); 'constant' stays available."""
    from sam_runner.optim import GSAM

    applied = {}
    for schedule in (None, "constant"):
        model = mlp()
        kw = {} if schedule is None else dict(rho_schedule=schedule)
        opt = GSAM(model.parameters(), torch.optim.SGD, lr=0.2, rho=0.05, **kw).bind(model=model)
        for g in opt.param_groups:
            g["lr"] = 0.05
        theta, seen = flat(model.parameters()), {}
        opt.step(closure_for(opt, model, record=seen))
        applied[schedule] = (seen[1] - theta).norm().item()
    assert applied[None] == pytest.approx(0.05 * 0.05 / 0.2, rel=1e-9)
    assert applied["constant"] == pytest.approx(0.05, rel=1e-9)
