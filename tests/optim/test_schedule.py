"""``perturb_schedule`` on every variant: random(p=1) is the variant and random(p=0) the base
optimizer bit for bit, late before/after ``perturb_from``, the count of perturbed steps under
random(p), AE-SAM's statistics against a float64 recurrence, exact resume, bad options."""

import copy
import math

import pytest
import torch
from optim_helpers import X, Y, bn_net, build, closure_for, flat, mlp

from sam_runner.optim import VARIANTS

PERTURBING = [n for n in sorted(VARIANTS) if VARIANTS[n].passes > 1]
# momentum-free where a variant asks for it; SAM-SPS sets its own step size
KW = {"sam_sps": dict(momentum=0.0)}
# variants whose first pass is not a plain pass at θ (AE-SAM decides on one)
REFUSE_ADAPTIVE = {"msam", "focal_sam", "flat_lora", "sampa"}


def _trajectory(name, steps=4, costs=None, **kw):
    model = mlp()
    opt = build(name, model, lr=0.05, **{**KW.get(name, {}), **kw})
    passes = []
    for _ in range(steps):
        calls = []
        opt.step(closure_for(opt, model, calls=calls, costs=costs))
        passes.append(len(calls))
    return flat(model.parameters()), passes, opt


def _base_trajectory(steps=4):
    """The base optimizer alone: plain SGD on the same model and batch."""
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(model(X), Y).backward()
        sgd.step()
    return flat(model.parameters())


@pytest.mark.parametrize("name", PERTURBING)
def test_random_with_p1_is_the_variant_and_p0_the_base_optimizer(name):
    want, want_passes, _ = _trajectory(name)
    got, got_passes, _ = _trajectory(name, perturb_schedule="random", perturb_prob=1.0)
    assert torch.equal(got, want) and got_passes == want_passes
    got, passes, _ = _trajectory(name, perturb_schedule="random", perturb_prob=0.0)
    assert passes == [1] * 4
    if not VARIANTS[name].replaces_lr:  # SAM-SPS computes its own step even on plain steps
        torch.testing.assert_close(got, _base_trajectory(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", PERTURBING)
def test_late_from_zero_is_the_variant_and_before_the_start_is_plain(name):
    want, _, _ = _trajectory(name)
    got, _, _ = _trajectory(name, perturb_schedule="late", perturb_from=0.0)
    assert torch.equal(got, want)
    # 10 steps of 10, from 0.5: steps 1-5 plain, 6-10 perturbed (k − 1 ≥ f·T)
    _, passes, _ = _trajectory(
        name, steps=10, perturb_schedule="late", perturb_from=0.5, total_steps=10
    )
    # the perturbed steps are the variant's first steps (LookSAM: a refresh, then reuse steps)
    _, own, _ = _trajectory(name, steps=5)
    assert passes == [1] * 5 + own and own[0] == VARIANTS[name].passes


@pytest.mark.parametrize("name", PERTURBING)
def test_late_from_an_epoch_is_the_base_before_it_and_the_variant_from_it(name):
    """Epoch E (an integer): the steps of epochs 1..E−1 are plain, every later one perturbs.
    4 epochs of 2 steps from epoch 3 is the fraction 0.5 of 8 steps, bit for bit."""
    kw = dict(steps=8, perturb_schedule="late", total_steps=8, steps_per_epoch=2)
    got, passes, _ = _trajectory(name, perturb_from=3, **kw)
    want, _, _ = _trajectory(name, perturb_from=0.5, **kw)
    _, own, _ = _trajectory(name, steps=4)
    assert torch.equal(got, want) and passes == [1] * 4 + own
    if not VARIANTS[name].replaces_lr:  # before epoch 3: the base optimizer's steps
        early, _, _ = _trajectory(name, perturb_from=3, **{**kw, "steps": 4})
        torch.testing.assert_close(early, _base_trajectory(4), rtol=1e-12, atol=1e-14)
    first, _, _ = _trajectory(name, perturb_from=1, **kw)  # epoch 1: the variant throughout
    assert torch.equal(first, _trajectory(name, steps=8)[0])


def test_late_before_the_start_is_the_base_step():
    got, _, _ = _trajectory("sam", perturb_schedule="late", perturb_from=1.0)
    torch.testing.assert_close(got, _base_trajectory(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("p", [0.25, 0.5, 0.9])
def test_perturbed_count_under_random_is_inside_the_binomial_interval(p):
    n = 2000
    opt = build("sam", mlp(), perturb_schedule="random", perturb_prob=p, perturb_seed=3)
    hits = sum(opt.schedule.decide(k) for k in range(1, n + 1))
    half = 3.2905 * math.sqrt(n * p * (1 - p))  # z of the two-sided 99.9% interval
    assert abs(hits - n * p) <= half


def test_random_draws_depend_on_the_seed():
    a = build("sam", mlp(), perturb_schedule="random", perturb_seed=1).schedule
    b = build("sam", mlp(), perturb_schedule="random", perturb_seed=2).schedule
    assert [a.decide(k) for k in range(64)] != [b.decide(k) for k in range(64)]


def test_adaptive_statistics_equal_a_float64_recurrence():
    model = mlp()
    delta, lam1, lam2, total = 0.8, -0.5, 1.5, 12
    opt = build(
        "sam", model, lr=0.05, perturb_schedule="adaptive", perturb_delta=delta,
        perturb_lambda1=lam1, perturb_lambda2=lam2, total_steps=total,
    )  # fmt: skip
    mu = var = 0.0
    for k in range(1, total + 1):
        # ‖g‖² at the current θ, before the step (float64 model)
        probe = copy.deepcopy(model)
        loss = torch.nn.functional.cross_entropy(probe(X), Y)
        grads = torch.autograd.grad(loss, list(probe.parameters()))
        q = float(sum((g.double() ** 2).sum() for g in grads))
        mu_prev = mu
        mu = delta * mu_prev + (1 - delta) * q
        var = delta * var + delta * (1 - delta) * (q - mu_prev) ** 2
        c = lam2 + (lam1 - lam2) * (k - 1) / total
        calls = []
        opt.step(closure_for(opt, model, calls=calls))
        assert opt.schedule.mu == pytest.approx(mu, rel=1e-12)
        assert opt.schedule.var == pytest.approx(var, rel=1e-12, abs=1e-300)
        assert opt.last_perturbed == (q >= mu + c * math.sqrt(var))
        assert len(calls) == (2 if opt.last_perturbed else 1)


@pytest.mark.parametrize(
    "kw",
    [
        dict(perturb_schedule="random", perturb_prob=0.5),
        dict(perturb_schedule="adaptive"),
        dict(perturb_schedule="late", perturb_from=0.3, total_steps=6),
    ],
)
def test_resume_takes_the_same_decisions(kw, tmp_path):
    model = bn_net()
    opt = build("sam", model, lr=0.05, momentum=0.9, **kw)
    for _ in range(3):
        opt.step(closure_for(opt, model))
    torch.save(
        dict(model=model.state_dict(), opt=opt.state_dict()), tmp_path / "ckpt.pt"
    )  # "killed" here
    decisions = []
    for _ in range(3):
        opt.step(closure_for(opt, model))
        decisions.append(opt.last_perturbed)
    saved = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)
    resumed = bn_net(seed=7)
    resumed.load_state_dict(saved["model"])
    opt2 = build("sam", resumed, lr=0.05, momentum=0.9, **kw)
    opt2.load_state_dict(saved["opt"])
    again = []
    for _ in range(3):
        opt2.step(closure_for(opt2, resumed))
        again.append(opt2.last_perturbed)
    assert again == decisions
    assert torch.equal(flat(resumed.parameters()), flat(model.parameters()))
    assert opt2.schedule.state() == opt.schedule.state()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(perturb_schedule="sometimes"), "perturb_schedule must be one of"),
        (dict(perturb_schedule="random", perturb_prob=1.5), r"perturb_prob must be .* \[0, 1\]"),
        (dict(perturb_schedule="random", perturb_prob=-0.1), "perturb_prob"),
        (dict(perturb_schedule="late", perturb_from=1.2), "perturb_from"),
        (dict(perturb_schedule="late", perturb_from=-0.5), "perturb_from"),
        (dict(perturb_schedule="adaptive", perturb_delta=1.0), "perturb_delta"),
        (dict(perturb_schedule="random", interval=2), "interval=2 applies to"),
        (dict(perturb_schedule="late", total_steps=None), "total_steps"),
        (dict(perturb_schedule="late", perturb_from=3.0), "a fraction .* or an epoch .*got 3.0"),
        (dict(perturb_schedule="late", perturb_from=True), "perturb_from"),
        (dict(perturb_schedule="late", perturb_from=2), "it needs steps_per_epoch > 0"),
        (
            dict(perturb_schedule="late", perturb_from=6, total_steps=9, steps_per_epoch=2),
            r"perturb_from=6 is beyond the last epoch \(5\)",
        ),
    ],
)
def test_bad_schedule_options(kw, message):
    with pytest.raises(ValueError, match=message):
        build("sam", mlp(), **kw)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("schedule", ["random", "adaptive"])
def test_grad_evals_are_the_closure_calls(name, schedule):
    if schedule == "adaptive" and name in REFUSE_ADAPTIVE:
        with pytest.raises(ValueError, match="adaptive"):
            _trajectory(name, perturb_schedule=schedule)
        return
    costs = []  # what each closure call cost, as the closure saw it
    _, passes, opt = _trajectory(name, steps=6, costs=costs, perturb_schedule=schedule)
    assert opt.grad_evals == pytest.approx(sum(costs), rel=1e-12)
    perturbed = sum(p > 1 for p in passes)
    if VARIANTS[name].single_pass_perturbation:  # one pass either way: SAM's decisions, same seed
        perturbed = _trajectory("sam", steps=6, perturb_schedule=schedule)[2].schedule.perturbed
    assert opt.summary_values() == {
        "grad_evals_per_step": pytest.approx(sum(costs) / 6, rel=1e-12),
        "perturbed_fraction": perturbed / 6,
    }
