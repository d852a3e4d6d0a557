"""WSAM: equal to pytorch_optimizer's WSAM (float64, 30 steps, decoupled and not), the formula of
one step, γ = 0 is the base optimizer's step, bad keys."""

import pytest
import torch
from optim_helpers import X, Y, build, closure_for, flat, mlp, ref_grad
from oracle_helpers import library_norm_in_float64, max_difference  # noqa: F401

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")


def _library_step(lib, closure):
    lib.step(closure)  # the library runs both passes from the closure


@pytest.mark.usefixtures("library_norm_in_float64")
@pytest.mark.parametrize(
    "base, base_kw",
    [
        (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=5e-4)),
        (torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2)),
    ],
    ids=["sgd", "adamw"],
)
@pytest.mark.parametrize("decouple", [True, False])
def test_wsam_equals_pytorch_optimizer_wsam(base, base_kw, decouple):
    def library(model):
        return pytorch_optimizer.WSAM(
            model,
            model.parameters(),
            base,
            rho=0.1,
            gamma=0.8,
            decouple=decouple,
            **base_kw,
        )

    worst = max_difference(
        "wsam", library, _library_step, base, base_kw, rho=0.1, gamma=0.8, decouple=decouple
    )
    assert worst <= 1e-10


@pytest.mark.parametrize("decouple", [True, False])
def test_wsam_one_step_follows_the_formula(decouple):
    """θ − η (g + α (g_s − g)) with plain SGD, decoupled or not (the same step without momentum)."""
    model, lr, rho, gamma = mlp(), 0.1, 0.05, 0.75
    opt = build("wsam", model, lr=lr, rho=rho, gamma=gamma, decouple=decouple)
    theta = flat(model.parameters())
    opt.step(closure_for(opt, model))
    _, g = ref_grad(model, theta)
    _, gs = ref_grad(model, theta + rho * g / g.norm())
    alpha = gamma / (1 - gamma)
    want = theta - lr * (g + alpha * (gs - g))
    torch.testing.assert_close(flat(model.parameters()), want, rtol=1e-10, atol=1e-13)


def test_wsam_decoupled_step_is_the_base_step_on_g_then_the_sharpness_term():
    """With momentum the two forms differ: decoupled, the base optimizer sees g alone."""
    model, lr, rho, gamma = mlp(), 0.1, 0.05, 0.5
    opt = build("wsam", model, lr=lr, momentum=0.9, rho=rho, gamma=gamma)
    opt.step(closure_for(opt, model))
    theta = flat(model.parameters())
    buf = flat(opt.base_optimizer.state[p]["momentum_buffer"] for p in model.parameters())
    opt.step(closure_for(opt, model))
    _, g = ref_grad(model, theta)
    _, gs = ref_grad(model, theta + rho * g / g.norm())
    want = theta - lr * (0.9 * buf + g) - lr * 1.0 * (gs - g)
    torch.testing.assert_close(flat(model.parameters()), want, rtol=1e-10, atol=1e-13)


def test_wsam_with_gamma_zero_is_the_base_optimizer_on_g():
    a, b = mlp(), mlp()
    wsam = build("wsam", a, lr=0.1, momentum=0.9, gamma=0.0)
    sgd = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        wsam.step(closure_for(wsam, a))
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(b(X), Y).backward()
        sgd.step()
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("gamma", [1.0, -0.1])
def test_wsam_bad_gamma(gamma):
    with pytest.raises(ValueError, match="gamma must be a number in \\[0, 1\\)"):
        build("wsam", mlp(), gamma=gamma)
