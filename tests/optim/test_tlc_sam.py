"""TLC-SAM: ρ moves toward the Taylor-error target and stays in [ρ_min, ρ_max]."""

import math

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad, ref_loss


def test_tlc_sam_matches_the_controller_over_steps():
    model, lr = mlp(), 0.1
    kw = dict(rho=0.05, tau_target=0.2, kappa=0.5, rho_min=0.01, rho_max=0.5)
    opt = build("tlc_sam", model, lr=lr, **kw)
    theta, rho, tau_bar = flat(model.parameters()), 0.05, None
    for _ in range(4):
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        loss, g = ref_grad(model, theta)
        eps = rho * g / g.norm()
        torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-8, atol=1e-12)
        rise = ref_loss(model, theta + eps) - loss
        pred = (g * eps).sum()
        tau = (rise - pred).abs() / (pred.abs() + 1e-12)
        tau_bar = tau if tau_bar is None else 0.9 * tau_bar + 0.1 * tau
        rho = min(max(rho * math.exp(0.5 * (0.2 - tau_bar.item())), 0.01), 0.5)
        assert opt.current_rho == pytest.approx(rho, rel=1e-9)
        _, d = ref_grad(model, theta + eps)
        theta = theta - lr * d
    torch.testing.assert_close(flat(model.parameters()), theta, rtol=1e-8, atol=1e-12)
    assert set(opt.log_values()) >= {"rho", "tau_bar", "grad_norm_max"}


@pytest.mark.parametrize("target, direction", [(5.0, 1), (0.0, -1)])
def test_tlc_sam_rho_moves_toward_the_target_and_stays_in_bounds(target, direction):
    """A loose target (τ* above any τ) grows ρ up to ρ_max; τ* = 0 shrinks it down to ρ_min."""
    model = mlp()
    opt = build(
        "tlc_sam", model, lr=0.05, rho=0.1, tau_target=target, kappa=50.0, rho_min=0.02, rho_max=0.3
    )
    rhos = []
    for _ in range(40):
        opt.step(closure_for(opt, model))
        rhos.append(opt.current_rho)
    assert all(0.02 - 1e-9 <= r <= 0.3 + 1e-9 for r in rhos)
    steps = [b - a for a, b in zip(rhos, rhos[1:])]
    assert all(direction * s >= -1e-12 for s in steps)
    assert rhos[-1] == pytest.approx(0.3 if direction > 0 else 0.02)
