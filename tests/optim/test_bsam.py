"""bSAM: equal to a float64 transcription of the official JAX step (team-approx-bayes/bayesian-sam
``optim.py``, one sub-batch) over 30 steps, the noise it draws N(0, 1/(N s)); without
``num_data`` no noise; the base step is not taken; bad keys."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad
from oracle_helpers import batches

N = 500.0


def _official(data, noises, lr, beta1, beta2, wd, rho, damping, s_init):
    """Per step (w the mean, s the precision, gm the momentum): g at w + n/√(N s); ε = ρ g/s;
    g_ε at w + ε; gs = √(s g²); gm ← β₁ gm + (1 − β₁)(g_ε + wd·w); w ← w − lr gm/s;
    s ← β₂ s + (1 − β₂)(gs + damping + wd)."""
    model = mlp()
    w = flat(model.parameters())
    s, gm, out = torch.full_like(w, s_init), torch.zeros_like(w), []
    for (x, y), n in zip(data, noises):
        _, g = ref_grad(model, w + n * torch.sqrt(1.0 / (N * s)), x, y)
        _, ge = ref_grad(model, w + rho * g / s, x, y)
        gs = torch.sqrt(s * g**2)
        gm = beta1 * gm + (1 - beta1) * (ge + wd * w)
        w = w - lr * gm / s
        s = beta2 * s + (1 - beta2) * (gs + damping + wd)
        out.append((w, s))
    return out


def test_bsam_equals_the_official_step_over_30_steps():
    kw = dict(lr=0.05, beta1=0.9, beta2=0.99, wd=1e-3, rho=0.01, damping=0.1, s_init=1.0)
    data = batches(30)
    model = mlp()
    opt = build(
        "bsam", model, lr=kw["lr"], weight_decay=kw["wd"], rho=kw["rho"], beta1=kw["beta1"],
        beta2=kw["beta2"], damping=kw["damping"], s_init=kw["s_init"], num_data=N,
    )  # fmt: skip
    got, noises = [], []
    for x, y in data:
        theta, seen = flat(model.parameters()), {}
        s = flat(opt.state[p]["bsam_s"] for p in model.parameters()) if opt.state else None
        s = torch.full_like(theta, kw["s_init"]) if s is None else s
        opt.step(closure_for(opt, model, x, y, record=seen))
        noises.append((seen[0] - theta) * torch.sqrt(N * s))  # the n our pass 0 drew
        got.append(
            (flat(model.parameters()), flat(opt.state[p]["bsam_s"] for p in model.parameters()))
        )
    want = _official(data, noises, **kw)
    worst = max(float((a - b).abs().max()) for (a, sa), (b, sb) in zip(got, want))
    worst_s = max(float((sa - sb).abs().max()) for (a, sa), (b, sb) in zip(got, want))
    assert worst <= 1e-10 and worst_s <= 1e-10
    n = torch.cat(noises)  # the noise is standard normal once scaled by √(N s)
    assert abs(float(n.mean())) < 0.05 and abs(float(n.std()) - 1) < 0.05


def test_without_num_data_there_is_no_noise():
    model = mlp()
    opt = build("bsam", model, num_data=None)
    theta, seen = flat(model.parameters()), {}
    with pytest.warns(UserWarning, match="num_data is not set"):
        opt.step(closure_for(opt, model, record=seen))
    assert torch.equal(seen[0], theta)


def test_the_noise_differs_by_step_and_seed_and_repeats_for_the_same():
    def first_point(seed):
        model = mlp()
        opt = build("bsam", model, num_data=N, perturb_seed=seed)
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        return seen[0]

    assert torch.equal(first_point(0), first_point(0))
    assert not torch.equal(first_point(0), first_point(1))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(beta2=1.0), "beta2"),
        (dict(s_init=0.0), "s_init"),
        (dict(num_data=0), "num_data"),
        (dict(damping=-1.0), "damping"),
    ],
)
def test_bsam_bad_keys(kw, message):
    with pytest.raises(ValueError, match=message):
        build("bsam", mlp(), **kw)
