"""Each sharpness measure on a quadratic model where its value is known in closed form.

Model: linear regression θ ↦ (1/2N) Σ (x_iᵀθ − y_i)², so H = XᵀX/N exactly and everywhere.
"""

import copy
import math

import pytest
import torch
from metrics_helpers import dense_hessian
from torch import nn

from sam_runner.metrics import sharpness as S
from sam_runner.metrics.hvp import HessianOperator
from sam_runner.metrics.objective import Objective


class Linear(nn.Module):
    def __init__(self, theta):
        super().__init__()
        self.theta = nn.Parameter(theta.clone())

    def forward(self, x):
        return x @ self.theta


def half_mse(pred, target):
    return 0.5 * (pred - target) ** 2


def problem(at_minimum=True, seed=0, d=6, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(
        0.3, 2.0, d, dtype=torch.float64
    )
    theta_star = torch.randn(d, generator=g, dtype=torch.float64)
    y = x @ theta_star
    theta = (
        theta_star if at_minimum else theta_star + torch.randn(d, generator=g, dtype=torch.float64)
    )
    model = Linear(theta)
    H = x.T @ x / n
    return model, [(x[:20], y[:20]), (x[20:], y[20:])], H


def test_worst_case_sharpness_at_a_minimum_is_half_rho2_lambda_max():
    model, batches, H = problem()
    rho = 0.1
    with Objective(model, half_mse, batches) as obj:
        value = S.worst_case_sharpness(obj, rho=rho, steps=60, seed=0)
    assert value == pytest.approx(0.5 * rho**2 * float(torch.linalg.eigvalsh(H)[-1]), rel=1e-3)
    assert torch.equal(model.theta.detach(), problem()[0].theta.detach())  # parameters restored


def test_adaptive_worst_case_sharpness_uses_the_asam_ball():
    model, batches, H = problem()
    rho, eta = 0.1, 0.01
    t = model.theta.detach().abs() + eta
    with Objective(model, half_mse, batches) as obj:
        value = S.worst_case_sharpness(obj, rho=rho, steps=80, adaptive=True, eta=eta, seed=0)
    expected = 0.5 * rho**2 * float(torch.linalg.eigvalsh(t[:, None] * H * t[None, :])[-1])
    assert value == pytest.approx(expected, rel=1e-3)


class Affine(Linear):
    def __init__(self, theta, bias):
        super().__init__(theta)
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x):
        return x @ self.theta + self.bias


def test_adaptive_worst_case_sharpness_puts_t_1_on_biases_as_asam_does():
    _, batches, _ = problem()
    model = Affine(problem()[0].theta.detach(), torch.tensor(0.0, dtype=torch.float64))
    x = torch.cat([b[0] for b in batches])
    xb = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], 1)  # [θ, bias] coordinates
    H = xb.T @ xb / len(x)
    rho, eta = 0.1, 0.01
    t = torch.cat([model.theta.detach().abs() + eta, torch.ones(1, dtype=torch.float64)])
    with Objective(model, half_mse, batches) as obj:
        value = S.worst_case_sharpness(obj, rho=rho, steps=80, adaptive=True, eta=eta, seed=0)
    expected = 0.5 * rho**2 * float(torch.linalg.eigvalsh(t[:, None] * H * t[None, :])[-1])
    assert value == pytest.approx(expected, rel=1e-3)


def test_average_sharpness_is_half_sigma2_trace():
    model, batches, H = problem()
    sigma = 0.05
    with Objective(model, half_mse, batches) as obj:
        mean, se = S.average_sharpness(obj, sigma=sigma, num_samples=2000, seed=0)
    assert abs(mean - 0.5 * sigma**2 * float(H.trace())) <= 4 * se


def test_directional_sharpness_along_eigenvectors_gives_eigenvalues():
    model, batches, H = problem(at_minimum=False)
    evals, evecs = torch.linalg.eigh(H)
    with HessianOperator(model, half_mse, batches) as op:
        mean, top = S.directional_sharpness(op, directions=[evecs[:, -1], evecs[:, 0]])
    assert top == pytest.approx(float(evals[-1]), rel=1e-12)
    assert mean == pytest.approx(float(evals[-1] + evals[0]) / 2, rel=1e-12)


def mlp(activation=nn.Tanh, dtype=torch.float32, seed=0):
    """A small classifier and its data: 60 samples in two batches."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 8), activation(), nn.Linear(8, 3)).to(dtype)
    x, y = torch.randn(60, 5, dtype=dtype), torch.randint(0, 3, (60,))
    return m, [(x[:32], y[:32]), (x[32:], y[32:])]


def dense_mean_hessian(model, batches):
    """The dense float64 Hessian of the mean cross-entropy over the batches (a float64 copy)."""
    ref = copy.deepcopy(model).double()
    x = torch.cat([b[0] for b in batches]).double()
    y = torch.cat([b[1] for b in batches])
    return dense_hessian(ref, nn.functional.cross_entropy, x, y)


def per_sample_gradients(model, batches):
    """[N, n] float64: each sample's gradient, one autograd call per sample."""
    ref = copy.deepcopy(model).double()
    rows = []
    for x, y in batches:
        for i in range(len(y)):
            loss = nn.functional.cross_entropy(ref(x[i : i + 1].double()), y[i : i + 1])
            grads = torch.autograd.grad(loss, list(ref.parameters()))
            rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows)


def test_directional_sharpness_is_d_h_d_on_a_float32_network():
    """Not quantised by float32 losses: dᵀHd by an HVP, against the dense float64 Hessian."""
    model, batches = mlp()
    H = dense_mean_hessian(model, batches)
    g = torch.Generator().manual_seed(3)  # the draws the measure makes with seed=3
    ds = [torch.randn(len(H), generator=g) for _ in range(4)]
    ds = [(d.double() / d.double().norm()).float().double() for d in ds]
    exact = [float(d @ H @ d / (d @ d)) for d in ds]
    with HessianOperator(model, nn.functional.cross_entropy, batches) as op:
        mean, top = S.directional_sharpness(op, num_directions=4, seed=3)
    assert mean == pytest.approx(sum(exact) / 4, rel=1e-6)
    assert top == pytest.approx(max(exact), rel=1e-6)


def test_armijo_probe_brackets_directional_curvature():
    model, batches, H = problem(at_minimum=False)
    with Objective(model, half_mse, batches) as obj:
        g = obj.gradient()
        q = float(g @ H @ g / (g @ g))
        c, beta = 1e-4, 0.5
        alpha, curvature, evals = S.armijo_probe(obj, alpha0=100.0, c=c, beta=beta)
    assert beta * 2 * (1 - c) / q < alpha <= 2 * (1 - c) / q
    assert q <= curvature < q / beta and evals >= 2


def test_fisher_trace_ratio_is_exact_on_the_quadratic():
    model, batches, H = problem(at_minimum=False)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    residual = x @ model.theta.detach() - y
    fisher = ((x * residual[:, None]) ** 2).mean(0)  # per-sample gradient x_i r_i, squared
    delta = 1e-3 * float(fisher.mean())  # damping relative to the Fisher's scale
    exact = float((torch.diagonal(H) / (fisher + delta)).sum())
    with HessianOperator(model, half_mse, batches) as op:
        value, se = S.fisher_trace_ratio(op, damping=1e-3)
    assert value == pytest.approx(exact, rel=1e-12) and se == 0.0


@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh])
def test_fisher_trace_ratio_exact_and_by_hutch_plus_plus_on_a_network(activation):
    """Against the dense Hessian's diagonal and per-sample gradients: exact when the model is small
    enough, and Hutch++ within four of its standard errors, which are small (the old Hutchinson
    estimate with 1/(F + 1e-8) weights had errors far larger than its value). On a ReLU network
    every H_ii ≥ 0, so the value is positive."""
    model, batches = mlp(activation, torch.float64)
    H = dense_mean_hessian(model, batches)
    fisher = per_sample_gradients(model, batches).square().mean(0)
    weight = 1 / (fisher + 1e-3 * fisher.mean())
    exact = float(torch.diagonal(H) @ weight)
    with HessianOperator(model, nn.functional.cross_entropy, batches) as op:
        value, se = S.fisher_trace_ratio(op)
        assert value == pytest.approx(exact, rel=1e-10) and se == 0.0
        for seed in range(3):
            estimate, se = S.fisher_trace_ratio(op, exact_max_params=0, seed=seed)
            assert abs(estimate - exact) <= 4 * se and 0 < se < 0.1 * abs(exact)
    if activation is nn.ReLU:
        assert exact > 0 and bool((torch.diagonal(H) >= -1e-12).all())


def test_fisher_trace_ratio_deflated_by_hessian_vectors_is_unbiased_and_exact_on_a_full_basis():
    """Deflated by W^½·(H's top eigenvectors): within four standard errors of the dense value for
    several seeds; with every eigenvector the span is everything, so the value is exact."""
    model, batches = mlp(nn.Tanh, torch.float64)
    H = dense_mean_hessian(model, batches)
    fisher = per_sample_gradients(model, batches).square().mean(0)
    exact = float(torch.diagonal(H) @ (1 / (fisher + 1e-3 * fisher.mean())))
    evals, evecs = torch.linalg.eigh(H)
    top = evecs[:, evals.abs().argsort(descending=True)[:3]].T
    with HessianOperator(model, nn.functional.cross_entropy, batches) as op:
        whole, se_whole = S.fisher_trace_ratio(op, num_probes=6, exact_max_params=0, basis=evecs.T)
        assert whole == pytest.approx(exact, rel=1e-8) and se_whole < 1e-8 * abs(exact)
        for seed in range(3):
            estimate, se = S.fisher_trace_ratio(
                op, num_probes=40, exact_max_params=0, seed=seed, basis=top
            )
            assert abs(estimate - exact) <= 4 * se and 0 < se < 0.2 * abs(exact)


def test_fisher_rao_norm_is_theta_fisher_theta():
    """⟨θ, Fθ⟩ with the (full) empirical Fisher F = mean g_n g_nᵀ, against per-sample gradients."""
    model, batches = mlp(nn.ReLU, torch.float64)
    grads = per_sample_gradients(model, batches)
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    fisher = grads.T @ grads / len(grads)
    squares = (grads @ theta) ** 2
    with Objective(model, nn.functional.cross_entropy, batches) as obj:
        value, se = S.fisher_rao_norm(obj)
    assert value == pytest.approx(float(theta @ fisher @ theta), rel=1e-10)
    assert se == pytest.approx(float(squares.std() / math.sqrt(len(squares))), rel=1e-10)


def test_bad_options_are_rejected():
    model, batches, _ = problem()
    with Objective(model, half_mse, batches) as obj:
        with pytest.raises(ValueError, match="rho=-1"):
            S.worst_case_sharpness(obj, rho=-1)
        with pytest.raises(ValueError, match="beta=2"):
            S.armijo_probe(obj, beta=2)


def test_armijo_probe_that_never_accepts_reports_nan():
    """alpha0 far too large and too few halvings: no trial passes, so there is no accepted α (the
    next, untested α·β would imply a curvature unrelated to q)."""
    model, batches, _ = problem(at_minimum=False)
    with Objective(model, half_mse, batches) as obj:
        alpha, curvature, evals = S.armijo_probe(obj, alpha0=1e6, max_steps=3)
    assert math.isnan(alpha) and math.isnan(curvature) and evals == 3
    # restored
    assert torch.equal(model.theta.detach(), problem(at_minimum=False)[0].theta.detach())


def test_fisher_measures_keep_every_module_in_its_own_mode():
    """The tracker's bn_mode=train state (root in eval, BatchNorm in train): the Fisher is taken in
    eval mode, and afterwards each module is back in its own mode for the HVPs that follow."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    m.eval()
    m[1].train()
    with HessianOperator(
        m, nn.functional.cross_entropy, [(x[:20], y[:20]), (x[20:], y[20:])]
    ) as op:
        S.fisher_trace_ratio(op, num_probes=6, exact_max_params=0)
        assert [mod.training for mod in m.modules()] == [False, False, True, False, False]
        S.fisher_rao_norm(op)
        assert [mod.training for mod in m.modules()] == [False, False, True, False, False]
