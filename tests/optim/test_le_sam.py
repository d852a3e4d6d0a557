"""LE-SAM: ε = σ g / (‖g‖² + δ), ⟨g, ε⟩ = σ, ‖ε‖ ≤ ρ_max."""

import math

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad


def test_le_sam_matches_the_formula_and_spends_the_loss_budget():
    model = mlp()
    opt = build("le_sam", model, lr=0.1, sigma=0.003, rho_max=10.0)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = 0.003 * g / (g.norm() ** 2 + 1e-12)
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    assert abs((g * (seen[1] - theta)).sum().item() - 0.003) < 1e-9  # ⟨g, ε⟩ = σ
    _, d = ref_grad(model, theta + eps)
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * d, rtol=1e-9, atol=1e-12)


def test_le_sam_caps_the_radius():
    model = mlp()
    opt = build("le_sam", model, lr=0.1, sigma=10.0, rho_max=0.02)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    torch.testing.assert_close(seen[1] - theta, 0.02 * g / g.norm(), rtol=1e-9, atol=1e-12)
    assert opt.log_values()["rho"] == 0.02 or abs(opt.log_values()["rho"] - 0.02) < 1e-9


def test_le_sam_cosine_sigma_schedule():
    """Step k (1-based) of T uses σ · ½(1 + cos(π (k−1)/T)), the full σ first: the applied ε is
    σ_k g / (‖g‖² + δ) (lr = 0 keeps g fixed), and current_sigma reports σ_k after the step."""
    model = mlp()
    opt = build("le_sam", model, lr=0.0, sigma=0.01, sigma_schedule="cosine", total_steps=4)
    theta = flat(model.parameters())
    _, g = ref_grad(model, theta)
    for k in range(4):
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        sigma = 0.01 * 0.5 * (1 + math.cos(math.pi * k / 4))
        torch.testing.assert_close(
            seen[1] - theta, sigma * g / (g @ g + 1e-12), rtol=1e-9, atol=1e-15
        )
        assert opt.current_sigma == pytest.approx(sigma, rel=1e-12)


def test_le_sam_config_refuses_a_radius_it_would_ignore():
    """A rho sweep across variants must not silently run le_sam jobs that ignore rho."""
    from conftest import compose

    from sam_runner.errors import UserError
    from sam_runner.optim.build import build_optimizer

    model = mlp()
    assert type(build_optimizer(compose("optimizer=le_sam"), model, 10)).__name__ == "LESAM"
    with pytest.raises(
        UserError, match=r"optimizer.rho=0.1 does not apply to le_sam.*optimizer.sigma"
    ):
        build_optimizer(compose("optimizer=le_sam", "optimizer.rho=0.1"), model, 10)


def test_le_sam_refuses_a_rho_schedule_it_would_ignore():
    """LE-SAM has no radius: rho_schedule is a one-line error pointing to sigma_schedule."""
    from conftest import compose

    from sam_runner.errors import UserError
    from sam_runner.optim.build import build_optimizer

    with pytest.raises(
        UserError,
        match=r"optimizer=le_sam: rho_schedule='cosine' does not apply.*"
        r"sigma_schedule='cosine'",
    ) as e:
        build_optimizer(compose("optimizer=le_sam", "optimizer.rho_schedule=cosine"), mlp(), 10)
    assert "\n" not in str(e.value)
