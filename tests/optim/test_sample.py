"""SAMPLe (our formulation) against its properties: on a quadratic the perturbed loss rises by
the budget; it is SAM where the budget does not bind, and SAM with ρ = δ/‖g‖ on its first step."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad

from sam_runner.optim import SAMPLe


def quadratic(diagonal, seed=0):
    """A parameter and the LBFGS-style closure of L(θ) = ½ θᵀ diag(a) θ + bᵀθ."""
    g = torch.Generator().manual_seed(seed)
    a = torch.tensor(diagonal, dtype=torch.float64)
    b = torch.randn(len(a), generator=g, dtype=torch.float64)
    theta = torch.nn.Parameter(torch.randn(len(a), generator=g, dtype=torch.float64) * 3)
    loss = lambda t: 0.5 * (a * t * t).sum() + (b * t).sum()
    return theta, loss


def rises(diagonal, budget, n=30, lr=0.05):
    theta, loss = quadratic(diagonal)
    opt = SAMPLe([theta], torch.optim.SGD, rho=10.0, budget=budget, lr=lr)
    out = []
    for _ in range(n):
        values = []

        def closure():
            opt.zero_grad()
            value = loss(theta)
            value.backward()
            values.append(value.detach())
            return value

        opt.step(closure)
        out.append(float(values[1] - values[0]))
    return out


def test_on_an_isotropic_quadratic_the_rise_is_the_budget_from_the_second_step():
    found = rises([2.0] * 6, budget=0.01)
    assert found[0] > 0.01  # the first step is first-order (κ = 0): the curvature adds to it
    for r in found[1:]:
        assert r == pytest.approx(0.01, rel=1e-9)


def test_on_an_anisotropic_quadratic_the_rise_tracks_the_budget():
    found = rises([0.5, 1.0, 2.0, 4.0, 8.0], budget=0.01, n=40)
    later = found[5:]
    errors = [abs(r / 0.01 - 1) for r in later]
    assert max(errors) < 0.35 and sum(errors) / len(errors) < 0.1


def test_where_the_budget_does_not_bind_it_is_sam_bit_for_bit():
    a, b = mlp(seed=3), mlp(seed=3)
    sam = build("sam", a, lr=0.1, momentum=0.9, rho=0.05)
    sample = build("sample", b, lr=0.1, momentum=0.9, rho=0.05, budget=1e6)
    for _ in range(4):
        sam.step(closure_for(sam, a))
        sample.step(closure_for(sample, b))
        assert torch.equal(flat(a.parameters()), flat(b.parameters()))


def test_its_first_step_is_sam_with_rho_budget_over_grad_norm():
    model = mlp(seed=1)
    theta = flat(model.parameters())
    _, g = ref_grad(model, theta)
    opt = build("sample", model, lr=0.1, rho=10.0, budget=0.02)
    seen = {}
    opt.step(closure_for(opt, model, record=seen))
    rho = 0.02 / g.norm()
    torch.testing.assert_close(seen[1] - theta, rho * g / g.norm(), rtol=1e-9, atol=1e-12)
    _, d = ref_grad(model, theta + rho * g / g.norm())
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * d, rtol=1e-9, atol=1e-12)
    logged = opt.log_values()
    assert logged["rho"] == pytest.approx(float(rho), rel=1e-9)
    assert set(logged) >= {"sample_curvature", "sample_rise"}


@pytest.mark.parametrize("budget", [0, -1.0, float("inf")])
def test_a_budget_that_is_not_positive_is_refused(budget):
    with pytest.raises(ValueError, match=r"budget=.* must be a finite number > 0"):
        build("sample", mlp(), budget=budget)
