"""SAMPa (sequential): equal to a float64 transcription of the paper's update over 30 steps with
SGD and momentum (the first step's passes both at θ); the notice; bad keys."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad
from oracle_helpers import batches


def _reference(data, lr, momentum, rho, lam):
    """x̃ = x + ρ g_y/‖g_y‖; y' = x − lr g_y; d = (1 − λ)∇f(x̃) + λ∇f(y'); SGD with momentum on
    d at x; g_y ← ∇f(y'). g_y = 0 at first (both points x)."""
    model = mlp()
    x = flat(model.parameters())
    gy, buf, out = torch.zeros_like(x), None, []
    for xb, yb in data:
        eps = rho * gy / (gy.norm() + 1e-12)
        _, g_pert = ref_grad(model, x + eps, xb, yb)
        _, g_y = ref_grad(model, x - lr * gy, xb, yb)
        d = (1 - lam) * g_pert + lam * g_y
        buf = d.clone() if buf is None else momentum * buf + d
        x = x - lr * buf
        gy = g_y
        out.append(x)
    return out


@pytest.mark.filterwarnings("ignore:sampa")
def test_sampa_equals_the_papers_update_over_30_steps():
    data = batches(30)
    model = mlp()
    opt = build("sampa", model, lr=0.05, momentum=0.9, rho=0.1, lam=0.2)
    got = []
    for x, y in data:
        opt.step(closure_for(opt, model, x, y))
        got.append(flat(model.parameters()))
    want = _reference(data, lr=0.05, momentum=0.9, rho=0.1, lam=0.2)
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 1e-10


def test_sampa_says_its_passes_run_one_after_the_other():
    with pytest.warns(UserWarning, match="one after the other"):
        build("sampa", mlp())


@pytest.mark.filterwarnings("ignore:sampa")
def test_sampa_bad_lam():
    with pytest.raises(ValueError, match="lam must be in \\[0, 1\\], got 1.5"):
        build("sampa", mlp(), lam=1.5)
