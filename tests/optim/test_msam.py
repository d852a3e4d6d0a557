"""MSAM: equal to a float64 transcription of the official update (MarlonBecker/MSAM
``optimizer/msam.py``: the parameters kept at θ − ρ v/‖v‖ between steps) over 30 steps; one
pass a step; the first step is the base step; schedules; resume; bad keys."""

import copy

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, build, closure_for, flat, mlp
from oracle_helpers import batches


def _official_msam(model, data, lr, momentum, rho, weight_decay=0.0, decay_at_theta=False):
    """The official step, transcribed: p holds θ − ρ v/‖v‖; the gradient there (plus wd·p);
    p += ρ v/‖v‖ (back to θ); v ← μ v + g; p −= lr v; p −= ρ v/‖v‖. Returns θ after each step.
    ``decay_at_theta``: wd·θ instead of wd·p (ours)."""
    params = list(model.parameters())
    bufs = [torch.zeros_like(p) for p in params]
    inv_norm, out = 0.0, []
    for x, y in data:
        for p in params:
            p.grad = None
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p, b in zip(params, bufs):
                if not decay_at_theta:
                    d = p.grad + weight_decay * p
                p.add_(b, alpha=rho * inv_norm)
                if decay_at_theta:
                    d = p.grad + weight_decay * p
                b.mul_(momentum).add_(d)
                p.add_(b, alpha=-lr)
            inv_norm = 1 / (torch.stack([b.norm() for b in bufs]).norm() + 1e-12)
            for p, b in zip(params, bufs):
                p.sub_(b, alpha=rho * inv_norm)
            out.append(
                torch.cat([(p + rho * inv_norm * b).reshape(-1) for p, b in zip(params, bufs)])
            )
    return out


def _ours(data, **kw):
    model = mlp()
    opt = build("msam", model, **kw)
    out = []
    for x, y in data:
        opt.step(closure_for(opt, model, x, y))
        out.append(flat(model.parameters()))
    return out, opt


def test_msam_equals_the_official_update_over_30_steps():
    data = batches(30)
    want = _official_msam(mlp(), data, lr=0.05, momentum=0.9, rho=0.3)
    got, _ = _ours(data, lr=0.05, momentum=0.9, rho=0.3)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want))
    assert worst <= 1e-10


def test_msam_with_weight_decay_differs_by_where_the_official_code_adds_it():
    """The official code adds wd·p at the perturbed point, ours (the base optimizer) at θ: with
    that one change the transcription is ours to rounding; without it they differ."""
    data = batches(30)
    kw = dict(lr=0.05, momentum=0.9, rho=0.3, weight_decay=5e-4)
    got, _ = _ours(data, **kw)
    moved = _official_msam(mlp(), data, decay_at_theta=True, **kw)
    assert max(float((a - b).abs().max()) for a, b in zip(got, moved)) <= 1e-10
    official = _official_msam(mlp(), data, **kw)
    assert max(float((a - b).abs().max()) for a, b in zip(got, official)) > 1e-6


def test_msam_takes_one_pass_at_the_perturbed_point():
    model = mlp()
    opt = build("msam", model, lr=0.05, momentum=0.9, rho=0.3)
    opt.step(closure_for(opt, model))
    theta0 = flat(model.parameters())
    before = theta0.clone()
    calls, seen = [], {}
    opt.step(closure_for(opt, model, calls=calls, record=seen))
    assert calls == [0]
    delta = flat(opt.state[p]["msam_delta"] for p in model.parameters())
    # the pass ran at θ + ρ Δ/‖Δ‖ with Δ the first step's update
    assert not torch.equal(seen[0], before)
    assert opt.summary_values()["grad_evals_per_step"] == 1.0
    assert torch.equal(flat(model.parameters()) - theta0, delta)


def test_msam_first_step_is_the_base_step_and_random_p0_is_the_base_optimizer():
    for kw in ({}, dict(perturb_schedule="random", perturb_prob=0.0)):
        a, b = mlp(), mlp()
        opt = build("msam", a, lr=0.05, momentum=0.9, **kw)
        sgd = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9)
        steps = 1 if not kw else 4
        for _ in range(steps):
            opt.step(closure_for(opt, a))
            sgd.zero_grad()
            F.cross_entropy(b(X), Y).backward()
            sgd.step()
        torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=0, atol=0)


def test_msam_resume_is_exact():
    data = batches(6)
    model = mlp()
    opt = build("msam", model, lr=0.05, momentum=0.9)
    for x, y in data[:3]:
        opt.step(closure_for(opt, model, x, y))
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    for x, y in data[3:]:
        opt.step(closure_for(opt, model, x, y))
    other = mlp(seed=5)
    other.load_state_dict(saved_model)
    opt2 = build("msam", other, lr=0.05, momentum=0.9)
    opt2.load_state_dict(saved_opt)
    for x, y in data[3:]:
        opt2.step(closure_for(opt2, other, x, y))
    assert torch.equal(flat(other.parameters()), flat(model.parameters()))


def test_msam_refuses_the_adaptive_schedule():
    with pytest.raises(ValueError, match="adaptive.*does not apply to msam"):
        build("msam", mlp(), perturb_schedule="adaptive")
