"""SAM-SPS: e = θ + ρ(1 − λ + λ/‖g‖) g; γ = clip((L(e) − ℓ* − ⟨∇L(e), e − θ⟩)/‖∇L(e)‖², 0,
γ_max)."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad

from sam_runner.optim import SAMSPS


@pytest.mark.parametrize("lam, floor", [(1.0, 0.0), (0.3, 0.5)])
def test_sam_sps_step_size_and_update_match_the_formula(lam, floor):
    model, rho, wd = mlp(), 0.1, 5e-4
    opt = build(
        "sam_sps",
        model,
        lr=123.0,
        rho=rho,
        lam=lam,
        loss_floor=floor,
        gamma_max=1.0,
        weight_decay=wd,
    )
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    e = theta + rho * (1 - lam + lam / g.norm()) * g
    torch.testing.assert_close(seen[1], e, rtol=1e-9, atol=1e-12)
    loss_e, g_e = ref_grad(model, e)
    gamma = ((loss_e - floor - (g_e * (e - theta)).sum()) / g_e.norm() ** 2).clamp(0, 1.0)
    assert float(opt.sps_step) == pytest.approx(gamma.item(), rel=1e-9)
    torch.testing.assert_close(
        flat(model.parameters()), theta - gamma * (g_e + wd * theta), rtol=1e-9, atol=1e-12
    )


def test_sam_sps_clips_the_step():
    model = mlp()
    opt = build("sam_sps", model, gamma_max=1e-3)
    opt.step(closure_for(opt, model))
    assert float(opt.sps_step) == pytest.approx(1e-3)


def test_sam_sps_rejects_a_non_sgd_base():
    model = mlp()
    with pytest.raises(ValueError, match="torch.optim.SGD.*AdamW"):
        SAMSPS(model.parameters(), torch.optim.AdamW, lr=0.1)
    with pytest.raises(ValueError, match="momentum must be 0"):
        SAMSPS(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)


def test_sam_sps_defaults_to_the_spec_weight_decay_and_replaces_the_lr():
    """wd = 5e-4 unless given (SGD's own default is 0); the class says the lr is not the step."""
    from sam_runner.optim import SAM

    model = mlp()
    opt = SAMSPS(model.parameters(), torch.optim.SGD, lr=0.1).bind(model=model)
    assert all(g["weight_decay"] == 5e-4 for g in opt.param_groups)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    loss_e, g_e = ref_grad(model, seen[1])
    gamma = ((loss_e - (g_e * (seen[1] - theta)).sum()) / g_e.norm() ** 2).clamp(0, 1.0)
    torch.testing.assert_close(
        flat(model.parameters()), theta - gamma * (g_e + 5e-4 * theta), rtol=1e-9, atol=1e-12
    )
    given = SAMSPS(mlp().parameters(), torch.optim.SGD, lr=0.1, weight_decay=0.0)
    assert all(g["weight_decay"] == 0.0 for g in given.param_groups)
    assert SAMSPS.replaces_lr is True and SAM.replaces_lr is False


def test_sam_sps_step_size_keeps_the_runs_float64():
    """γ is computed in the run's dtype: on a float64 model it equals the float64 formula to
    1e-10 (the loss used to be rounded to float32 first, an error of ~1e-8 in γ)."""
    model = mlp()
    opt = build("sam_sps", model, rho=0.1, gamma_max=10.0, loss_floor=0.0)
    theta = flat(model.parameters())
    opt.step(closure_for(opt, model))
    _, g = ref_grad(model, theta)
    e = theta + 0.1 * g / g.norm()
    loss_e, g_e = ref_grad(model, e)
    gamma = (loss_e - (g_e * (e - theta)).sum()) / g_e.norm() ** 2
    assert opt.sps_step.dtype == torch.float64
    assert float(opt.sps_step) == pytest.approx(gamma.item(), rel=1e-10)
