"""F-SAM: equal to pytorch_optimizer's FriendlySAM (float64, 30 steps), the formula of one step,
the momentum's first-step rule, bad keys."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad
from oracle_helpers import batches, library_norm_in_float64, max_difference  # noqa: F401

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")


def _library_step(lib, closure):
    closure()  # the library wants the gradients at θ in place before step
    lib.step(closure)


@pytest.mark.parametrize(
    "base, base_kw",
    [
        (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=5e-4)),
        (torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2)),
    ],
    ids=["sgd", "adamw"],
)
@pytest.mark.parametrize("sigma, lmbda", [(1.0, 0.9), (0.5, 0.6)])
@pytest.mark.usefixtures("library_norm_in_float64")
def test_fsam_equals_pytorch_optimizer_friendly_sam(base, base_kw, sigma, lmbda):
    def library(model):
        return pytorch_optimizer.FriendlySAM(
            model.parameters(), base, rho=0.1, sigma=sigma, lmbda=lmbda, **base_kw
        )

    worst = max_difference(
        "fsam", library, _library_step, base, base_kw, rho=0.1, sigma=sigma, lmbda=lmbda
    )
    assert worst <= 1e-10


def test_fsam_against_the_library_as_shipped_differs_by_its_float32_norm_alone():
    """Unpatched, the library's float32 ‖d‖ moves the trajectory by more than 1e-10 and less
    than 1e-7: the only difference, and documented."""
    base_kw = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
    worst = max_difference(
        "fsam",
        lambda model: pytorch_optimizer.FriendlySAM(
            model.parameters(), torch.optim.SGD, rho=0.1, **base_kw
        ),
        _library_step,
        torch.optim.SGD,
        base_kw,
        rho=0.1,
    )
    assert 1e-10 < worst < 1e-7


def test_fsam_two_steps_follow_the_formula():
    """Step 1: SAM's (m = g); step 2: ε = ρ d/‖d‖, d = g₂ − σ m₁, then m₂ = λ m₁ + (1 − λ) g₂."""
    model, lr, rho, sigma, lmbda = mlp(), 0.1, 0.05, 0.7, 0.8
    opt = build("fsam", model, lr=lr, rho=rho, sigma=sigma, lmbda=lmbda)
    (x1, y1), (x2, y2) = batches(2)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, x1, y1, record=seen))
    _, g1 = ref_grad(model, theta, x1, y1)
    torch.testing.assert_close(seen[1] - theta, rho * g1 / g1.norm(), rtol=1e-10, atol=1e-13)
    theta2 = flat(model.parameters())
    opt.step(closure_for(opt, model, x2, y2, record=seen))
    _, g2 = ref_grad(model, theta2, x2, y2)
    d = g2 - sigma * g1
    torch.testing.assert_close(seen[1] - theta2, rho * d / d.norm(), rtol=1e-10, atol=1e-13)
    _, gs = ref_grad(model, theta2 + rho * d / d.norm(), x2, y2)
    torch.testing.assert_close(flat(model.parameters()), theta2 - lr * gs, rtol=1e-10, atol=1e-13)
    m = flat(opt.state[p]["fsam_momentum"] for p in model.parameters())
    torch.testing.assert_close(m, lmbda * g1 + (1 - lmbda) * g2, rtol=1e-10, atol=1e-13)


def test_fsam_with_sigma_zero_is_sam():
    a, b = mlp(), mlp()
    fsam, sam = build("fsam", a, sigma=0.0), build("sam", b)
    for x, y in batches(3):
        fsam.step(closure_for(fsam, a, x, y))
        sam.step(closure_for(sam, b, x, y))
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kw, message", [(dict(sigma=-1.0), "sigma"), (dict(lmbda=1.5), "lmbda")])
def test_fsam_bad_keys(kw, message):
    with pytest.raises(ValueError, match=message):
        build("fsam", mlp(), **kw)
