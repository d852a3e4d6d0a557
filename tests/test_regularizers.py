"""regularizer=jsd: the α-skew JSD against float64 formulas and scipy, its local expansion, the
regularizer's term and gradient, weight=0 bit for bit the plain run, and its bad keys."""

import math

import numpy as np
import pytest
import torch
from conftest import TINY, compose, run_cli
from scipy.spatial.distance import jensenshannon
from torch import nn

from sam_runner.losses import skew_jsd
from sam_runner.regularizers import build_regularizer
from sam_runner.regularizers.jsd import SkewJSD
from sam_runner.train import train


def _probs(n=7, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(3 * torch.randn(n, c, generator=g, dtype=torch.float64), 1)


@pytest.mark.parametrize("alpha", [0.1, 0.25, 0.5, 0.75, 0.9])
def test_skew_jsd_is_the_float64_formula(alpha):
    p, q = _probs(seed=1), _probs(seed=2)
    got = skew_jsd(p, q, alpha)
    for row in range(len(p)):
        a, b = p[row].tolist(), q[row].tolist()
        m = [alpha * x + (1 - alpha) * y for x, y in zip(a, b)]
        kl_p = sum(x * math.log(x / z) for x, z in zip(a, m))
        kl_q = sum(y * math.log(y / z) for y, z in zip(b, m))
        assert got[row].item() == pytest.approx(alpha * kl_p + (1 - alpha) * kl_q, rel=1e-12)


def test_skew_jsd_at_one_half_is_scipys_jensen_shannon_squared():
    p, q = _probs(seed=3), _probs(seed=4)
    p[0, 0] = 0.0  # a zero probability: x log x → 0
    p[0] = p[0] / p[0].sum()
    want = [jensenshannon(a, b) ** 2 for a, b in zip(p.numpy(), q.numpy())]
    np.testing.assert_allclose(skew_jsd(p, q, 0.5).numpy(), want, rtol=1e-10)
    assert skew_jsd(p, p, 0.3).abs().max() < 1e-15


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8])
def test_expansion_is_alpha_one_minus_alpha_times_half_chi_squared(alpha):
    p = _probs(n=1, seed=5)[0]
    d = torch.randn(5, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    d = p * (d - (p * d).sum())  # relative to each p_i, and p + δ stays a distribution
    ratios = []
    for eps in (1e-2, 1e-3, 1e-4):
        delta = eps * d
        local = alpha * (1 - alpha) * 0.5 * (delta**2 / p).sum()
        ratios.append((skew_jsd(p[None], (p + delta)[None], alpha)[0] / local).item())
    errors = [abs(r - 1) for r in ratios]
    assert errors[-1] < 1e-3 and errors[0] > errors[1] > errors[2]  # → 1 as δ → 0


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).double()


X = torch.randn(8, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


@pytest.mark.parametrize("space", ["parameter", "input"])
def test_the_term_is_the_divergence_to_a_perturbed_forward_of_the_given_radius(space):
    net = _net()
    reg = SkewJSD(alpha=0.3, weight=2.0, space=space, radius=0.1)
    running = net[1].running_mean.clone()
    torch.manual_seed(11)
    state, x2 = reg.perturbed_inputs(net, X)
    if space == "input":
        assert abs((x2 - X).std().item() - 0.1) < 0.03
    else:
        dist = sum((state[n] - p).square().sum() for n, p in net.named_parameters())
        assert dist.sqrt().item() == pytest.approx(0.1, rel=1e-9)
    other = torch.func.functional_call(net, state, (x2,))
    logits = net(X)
    want = 2.0 * 0.5 * skew_jsd(logits.softmax(1), other.softmax(1), 0.3).mean()
    running_after_first = net[1].running_mean.clone()
    torch.manual_seed(11)
    got = reg.add(torch.zeros((), dtype=torch.float64), net, X, logits, 0.5)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert got > 0
    # the second forward leaves BatchNorm's running statistics alone
    assert torch.equal(net[1].running_mean, running_after_first)
    assert not torch.equal(running, running_after_first)


def test_its_gradient_reaches_the_parameters_and_vanishes_at_radius_zero():
    net = _net()
    logits = net(X)
    reg = SkewJSD(alpha=0.5, weight=1.0, space="parameter", radius=0.0)
    term = reg.add(torch.zeros((), dtype=torch.float64), net, X, logits, 1.0)
    term.backward()
    assert term.item() == 0 and all(p.grad.abs().max() == 0 for p in net.parameters())
    net.zero_grad()
    logits = net(X)
    reg.radius = 0.5
    reg.add(torch.zeros((), dtype=torch.float64), net, X, logits, 1.0).backward()
    assert any(p.grad.abs().max() > 0 for p in net.parameters())


@pytest.mark.parametrize("space", ["parameter", "input"])
def test_detach_makes_the_perturbed_prediction_a_fixed_target(space):
    """The same value; the gradient that of JSD(p(x; θ) ‖ q) with q held fixed: it reaches θ
    through p alone (no backward through the second forward), and differs from both paths'."""
    grads = {}
    for detach in (False, True):
        net = _net()
        reg = SkewJSD(alpha=0.3, weight=2.0, space=space, radius=0.5, detach=detach)
        logits = net(X)
        torch.manual_seed(11)
        term = reg.add(torch.zeros((), dtype=torch.float64), net, X, logits, 0.5)
        grads[detach] = torch.autograd.grad(term, list(net.parameters()))
        net.zero_grad()
        torch.manual_seed(11)
        state, x2 = reg.perturbed_inputs(net, X)
        q = torch.func.functional_call(net, state, (x2,)).softmax(1).detach()
        want = 2.0 * 0.5 * skew_jsd(net(X).softmax(1), q, 0.3).mean()
        torch.testing.assert_close(term, want, rtol=1e-12, atol=0)
        if detach:
            manual = torch.autograd.grad(want, list(net.parameters()))
            for got, ref in zip(grads[True], manual):
                torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-14)
    assert any(not torch.allclose(a, b) for a, b in zip(grads[False], grads[True]))


def test_weight_zero_and_none_build_the_plain_loss():
    # no part: the run's loss is the plain one
    assert build_regularizer(compose("regularizer=jsd", "regularizer.weight=0").regularizer) is None
    assert build_regularizer(compose().regularizer) is None
    assert isinstance(build_regularizer(compose("regularizer=jsd").regularizer), SkewJSD)


def _weights(run_dir):
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    return state["model"], state["optimizer"]


def test_weight_zero_trains_the_plain_run_bit_for_bit_and_jsd_changes_it(tmp_path):
    tiny = [*TINY, "trainer.epochs=1", "metrics=off"]
    runs = {}
    for name, extra in (("plain", []), ("zero", ["regularizer=jsd", "regularizer.weight=0"]),
                        ("jsd", ["regularizer=jsd", "regularizer.space=input"])):  # fmt: skip
        train(compose(*tiny, *extra), tmp_path / name)
        runs[name] = _weights(tmp_path / name)[0]
    assert all(torch.equal(runs["plain"][k], runs["zero"][k]) for k in runs["plain"])
    assert not all(torch.equal(runs["plain"][k], runs["jsd"][k]) for k in runs["plain"])


@pytest.mark.parametrize("space", ["parameter", "input"])
def test_esam_with_jsd_trains_and_its_selection_forward_adds_no_term(space, tmp_path):
    """ESAM's forward without gradients (every parameter frozen) gets no penalty: nothing would
    carry its gradient, and the parameter-space draw has no trainable tensor to perturb."""
    model = nn.Sequential(nn.Linear(4, 3))
    jsd = SkewJSD(0.5, 1.0, space, 0.1)
    x = torch.randn(5, 4)
    for p in model.parameters():
        p.requires_grad_(False)
    loss = torch.tensor(0.7, requires_grad=True)
    assert jsd.add(loss, model, x, model(x), 1.0) is loss
    cfg = compose(*TINY, "trainer.epochs=1", "metrics=off", "optimizer=esam", "regularizer=jsd",
                  f"regularizer.space={space}")  # fmt: skip
    assert train(cfg, tmp_path)["status"] == "completed"


@pytest.mark.parametrize(
    "override,message",
    [
        ("regularizer.alpha=1", "regularizer.alpha=1 must be a number in (0, 1)"),
        ("regularizer.alpha=0", "regularizer.alpha=0 must be a number in (0, 1)"),
        (
            "regularizer.space=output",
            "regularizer.space='output' is unknown; choose parameter, input",
        ),
        ("regularizer.radius=-1", "regularizer.radius=-1 must be a finite number >= 0"),
        ("regularizer.weight=-0.5", "regularizer.weight=-0.5 must be a finite number >= 0"),
        ("regularizer.detach=maybe", "regularizer.detach='maybe' must be true or false"),
    ],
)
def test_bad_jsd_keys_are_one_line_and_exit_2(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    code, _, err = run_cli(["regularizer=jsd", override, f"hydra.run.dir={run}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not run.exists()


def test_a_sweep_trains_the_weight_zero_run_once_whatever_the_other_keys():
    from sam_runner.sweep.plan import collapse

    jobs, left_out = collapse([
        ["regularizer.weight=0", "regularizer.alpha=0.1", "seed=0"],
        ["regularizer.weight=0", "regularizer.alpha=0.5", "seed=0"],
        ["regularizer.weight=1", "regularizer.alpha=0.1", "seed=0"],
        ["regularizer.weight=1", "regularizer.alpha=0.5", "seed=0"],
    ])  # fmt: skip
    assert jobs == [
        ["regularizer.weight=0", "seed=0"],
        ["regularizer.weight=1", "regularizer.alpha=0.1", "seed=0"],
        ["regularizer.weight=1", "regularizer.alpha=0.5", "seed=0"],
    ]
    assert left_out == ["regularizer.weight=0 seed=0"]
