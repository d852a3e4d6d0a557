"""Focal-SAM: equal to a float64 transcription of the official step (scongl/Focal-SAM
``train_step.py`` and ``focal_sam.py``) over 30 steps with momentum; the class weights; a closure
without ``reduce_loss`` is refused; bad keys."""

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, build, closure_for, flat, mlp, unflatten
from oracle_helpers import batches
from torch.func import functional_call

COUNTS = [50.0, 10.0, 2.0]


def _grad(model, vec, x, y, weights):
    """∇ (1/B) Σ w_{y_i} ℓ_i at the flat vector ``vec``."""
    v = vec.detach().clone().requires_grad_(True)
    losses = F.cross_entropy(functional_call(model, unflatten(model, v), (x,)), y, reduction="none")
    (g,) = torch.autograd.grad((weights[y] * losses).sum() / len(y), v)
    return g


def _official(data, lr, momentum, rho, gamma, lam):
    """Per step: g₁ with weights 1 − c, g₂ with c (both at θ), ε = ρ g₂/(‖g₂‖ + 1e-12), g₃ with c at
    θ + ε; SGD with momentum on g₁ + g₃. c_y = λ (1 − n_y/N)^γ."""
    model = mlp()
    counts = torch.tensor(COUNTS, dtype=torch.float64)
    c = lam * (1 - counts / counts.sum()) ** gamma
    theta, buf, out = flat(model.parameters()), None, []
    for x, y in data:
        g1, g2 = _grad(model, theta, x, y, 1 - c), _grad(model, theta, x, y, c)
        eps = rho * g2 / (g2.norm() + 1e-12)
        d = g1 + _grad(model, theta + eps, x, y, c)
        buf = d.clone() if buf is None else momentum * buf + d
        theta = theta - lr * buf
        out.append(theta)
    return out


def test_focal_sam_equals_the_official_step_over_30_steps():
    data = batches(30)
    kw = dict(lr=0.05, momentum=0.9, rho=0.2, focal_gamma=3.0, sharpness=0.5)
    model = mlp()
    opt = build("focal_sam", model, class_counts=COUNTS, **kw)
    got = []
    for x, y in data:
        opt.step(closure_for(opt, model, x, y))
        got.append(flat(model.parameters()))
    want = _official(data, kw["lr"], kw["momentum"], kw["rho"], kw["focal_gamma"], kw["sharpness"])
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 1e-10


def test_focal_sam_with_equal_classes_and_full_weight_is_sam():
    """c = 1 for every class (λ = 1, γ = 0): (1 − c) ℓ(θ) vanishes, the step is SAM's."""
    a, b = mlp(), mlp()
    focal = build("focal_sam", a, rho=0.05, sharpness=1.0, focal_gamma=0.0)
    sam = build("sam", b, rho=0.05)
    for _ in range(3):
        focal.step(closure_for(focal, a))
        sam.step(closure_for(sam, b))
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-12, atol=1e-14)


def test_focal_sam_class_weights_favour_rare_classes():
    opt = build("focal_sam", mlp(), class_counts=COUNTS, focal_gamma=2.0, sharpness=0.8)
    w = opt.class_weights(3, torch.device("cpu"))
    freq = torch.tensor(COUNTS, dtype=torch.float64) / sum(COUNTS)
    torch.testing.assert_close(w, 0.8 * (1 - freq) ** 2)
    assert w[2] > w[1] > w[0]


def test_a_closure_without_reduce_loss_is_refused():
    model = mlp()
    opt = build("focal_sam", model)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(X), Y)
        loss.backward()
        return loss

    with pytest.raises(ValueError, match="reduce_loss"):
        opt.step(closure)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(sharpness=1.5), "sharpness"),
        (dict(focal_gamma=-1.0), "focal_gamma"),
        (dict(class_counts=[0, 0]), "class_counts"),
        (dict(perturb_schedule="adaptive"), "adaptive"),
    ],
)
def test_focal_sam_bad_keys(kw, message):
    with pytest.raises(ValueError, match=message):
        build("focal_sam", mlp(), **kw)
