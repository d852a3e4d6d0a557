"""The sharpness dimension: the Kaplan–Yorke formula, the heavy-ball map's exponents against its
Jacobian, and the dense spectrum against a dense Hessian."""

import math

import pytest
import torch
from metrics_helpers import dense_hessian
from torch import nn

from sam_runner.metrics import sharpness_dimension, spectral_density
from sam_runner.metrics.hvp import HessianOperator
from sam_runner.metrics.sharpness_dim import (
    dense_eigenvalues,
    density_quantiles,
    estimated_eigenvalues,
    exponents,
    kaplan_yorke,
)


def test_kaplan_yorke_by_hand():
    # χ = log 3, log 2, log ½, log ¼: sums log3, log6, log3 ≥ 0, then log ¾ < 0: k = 3
    lr = 1.0
    eigenvalues = [4.0, 3.0, 0.5, 0.75]  # |1 − λ| = 3, 2, 0.5, 0.25
    chis = sorted((math.log(3), math.log(2), math.log(0.5), math.log(0.25)), reverse=True)
    k_sum = chis[0] + chis[1] + chis[2]
    assert sharpness_dimension(eigenvalues, lr) == pytest.approx(3 + k_sum / abs(chis[3]))


def test_edge_cases():
    assert sharpness_dimension([0.5, 0.2], 1.0) == 0.0  # every exponent < 0: contracting
    assert sharpness_dimension([3.0, -1.0], 1.0) == 2.0  # every partial sum ≥ 0: the count
    assert kaplan_yorke([math.log(2), -math.inf]) == 1.0  # lr·λ = 1 exactly
    with pytest.raises(ValueError, match="lr=0 must be a finite number > 0"):
        sharpness_dimension([1.0], 0)


def test_weight_decay_adds_to_every_eigenvalue():
    assert sharpness_dimension([2.9, 0.1], 1.0, weight_decay=0.1) == pytest.approx(
        sharpness_dimension([3.0, 0.2], 1.0)
    )


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_heavy_ball_exponents_are_those_of_its_jacobian(beta):
    # a quadratic ½θᵀHθ: the map (θ, b) ↦ (θ − η(βb + Hθ), βb + Hθ) is linear; its exponents are
    # the log moduli of its matrix's eigenvalues
    torch.manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    lam = torch.tensor([30.0, 5.0, 0.3, -2.0], dtype=torch.float64)
    H = q @ torch.diag(lam) @ q.T
    lr, eye = 0.1, torch.eye(4, dtype=torch.float64)
    J = torch.cat([torch.cat([eye - lr * H, -lr * beta * eye], 1), torch.cat([H, beta * eye], 1)])
    reference = sorted(torch.linalg.eigvals(J).abs().log().tolist(), reverse=True)
    ours = sorted(exponents(lam.tolist(), lr, beta), reverse=True)
    if beta == 0.0:  # the b-block is 0: those exponents are −∞ and GD's are the rest
        assert ours == pytest.approx(reference[:4], abs=1e-9)
    else:
        assert ours == pytest.approx(reference, abs=1e-9)
        assert sharpness_dimension(lam.tolist(), lr, beta) == pytest.approx(kaplan_yorke(reference))


def test_dense_spectrum_and_the_estimate():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).double()
    x, y = torch.randn(100, 6, dtype=torch.float64), torch.randint(0, 3, (100,))

    def loss_fn(out, t):
        return nn.functional.cross_entropy(out, t, reduction="none")

    reference = torch.linalg.eigvalsh(dense_hessian(model, lambda o, t: loss_fn(o, t).mean(), x, y))
    with HessianOperator(model, loss_fn, [(x, y)]) as op:
        dense = dense_eigenvalues(op)
        density = spectral_density(op, num_runs=3, num_steps=25, seed=0)
        estimate = estimated_eigenvalues(op, 0, density, seed=0)
        with_top = estimated_eigenvalues(op, 5, density, seed=0)
    torch.testing.assert_close(dense, reference, rtol=1e-6, atol=1e-8)
    n = len(reference)
    for scale in (0.5, 1.5, 3.0):  # below, beyond and far beyond the edge of stability
        lr = scale / float(reference[-1])
        exact = sharpness_dimension(dense.tolist(), lr)
        for values in (estimate, with_top):  # the documented target: within 5% of n
            assert abs(sharpness_dimension(values.tolist(), lr) - exact) <= 0.05 * n
    assert float(with_top[0]) == pytest.approx(float(reference[-1]), rel=1e-3)


def test_density_quantiles_spread_as_the_weights():
    density = {"nodes": [[0.0, 1.0]], "weights": [[0.25, 0.75]]}
    assert density_quantiles(density, 4).tolist() == [0.0, 1.0, 1.0, 1.0]


def test_the_step_a_run_measures_with():
    from omegaconf import OmegaConf

    from sam_runner.errors import UserError
    from sam_runner.metrics.sharpness_dim import step_for

    sgd = OmegaConf.create(
        {"base_optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}}
    )
    on = {"sharpness_dim": {"enabled": True, "lr": None}}
    assert step_for(on, sgd) == {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}
    assert step_for({"sharpness_dim": {"enabled": True, "lr": 0.02}}, sgd)["lr"] == 0.02
    adamw = OmegaConf.create({"base_optimizer": {"name": "adamw", "lr": 1e-3}})
    assert step_for(on, adamw) is None  # not gradient descent's map: the key is left out
    zero = OmegaConf.create({"base_optimizer": {"name": "sgd", "lr": 0.0}})
    with pytest.raises(UserError, match=r"needs a step size > 0: base_optimizer.lr=0.0"):
        step_for(on, zero)
