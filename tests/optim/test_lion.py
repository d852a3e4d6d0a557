"""Lion and Lion-K: against timm's Lion, against the family's formula in float64, under SAM, and
from the config (keys reach the optimizer; bad keys are one line and exit 2)."""

import pytest
import timm.optim
import torch
from conftest import compose, run_cli
from optim_helpers import closure_for, flat, mlp, ref_grad

from sam_runner.optim import SAM, Lion, LionK
from sam_runner.optim.build import build_optimizer


def _trajectory(make, steps=50, seed=0):
    """Parameters after ``steps`` full-batch steps of the optimizer ``make(params)``."""
    model = mlp(seed)
    opt = make(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(_X), _Y).backward()
        opt.step()
    return flat(model.parameters())


_X = torch.randn(32, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
_Y = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(4))
KW = dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.2)


def test_lion_equals_timms_lion_over_50_steps_with_weight_decay():
    ours = _trajectory(lambda p: Lion(p, **KW))
    theirs = _trajectory(lambda p: timm.optim.Lion(p, **KW))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    assert not torch.equal(ours, _trajectory(lambda p: torch.optim.SGD(p, lr=0)))  # it moved


def test_lion_k_l1_is_lion():
    assert torch.equal(
        _trajectory(lambda p: LionK(p, k="l1", **KW)), _trajectory(lambda p: Lion(p, **KW))
    )


def _formula_steps(k, delta, steps=5):
    """The family's update written out in float64 per tensor, beside LionK's."""
    model = mlp(1)
    mom = [torch.zeros_like(p) for p in model.parameters()]
    opt = LionK(model.parameters(), k=k, delta=delta, **KW)
    lr, (b1, b2), wd = KW["lr"], KW["betas"], KW["weight_decay"]
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(_X), _Y).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        ref = [p.detach().clone() for p in model.parameters()]  # each step from LionK's iterate
        opt.step()
        for i, g in enumerate(grads):
            u = b1 * mom[i] + (1 - b1) * g
            if k == "l2":
                direction = u / torch.sqrt((u * u).sum())
            else:
                direction = torch.clamp(u / delta, -1, 1)
            ref[i] = ref[i] - lr * (direction + wd * ref[i])
            mom[i] = b2 * mom[i] + (1 - b2) * g
        got = [p.detach() for p in model.parameters()]
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("k,delta", [("l2", 1.0), ("huber", 1e-2), ("huber", 10.0)])
def test_lion_k_l2_and_huber_follow_the_formula(k, delta):
    _formula_steps(k, delta)


def test_huber_between_its_limits():
    u = torch.tensor([-3.0, -0.5, 0.0, 0.25, 2.0], dtype=torch.float64)
    from sam_runner.optim.lion import grad_k

    assert grad_k(u, "huber", 1.0).tolist() == [-1.0, -0.5, 0.0, 0.25, 1.0]
    assert torch.equal(grad_k(u, "huber", 1e-9), torch.sign(u))  # δ → 0: Lion
    assert torch.equal(grad_k(torch.zeros(3), "l2", 1.0), torch.zeros(3))


def test_sam_over_lion_takes_lions_step_from_the_perturbed_gradient():
    model = mlp()
    opt = SAM(model.parameters(), Lion, rho=0.05, total_steps=10, **KW).bind(model=model)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = 0.05 * g / g.norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    _, d = ref_grad(model, theta + eps)
    b1, lr, wd = KW["betas"][0], KW["lr"], KW["weight_decay"]
    expected = theta - lr * (torch.sign((1 - b1) * d) + wd * theta)  # m = 0 on the first step
    torch.testing.assert_close(flat(model.parameters()), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["lion", "lion_k"])
def test_the_yaml_builds_the_optimizer_with_its_keys(name):
    extra = ["base_optimizer.k=huber", "base_optimizer.delta=0.01"] if name == "lion_k" else []
    cfg = compose("optimizer=sam", f"base_optimizer={name}", "base_optimizer.lr=1e-4", *extra)
    model = mlp()
    opt = build_optimizer(cfg, model, 10)
    base = opt.base_optimizer
    assert isinstance(base, LionK)
    group = base.param_groups[0]
    assert group["lr"] == 1e-4 and group["betas"] == (0.9, 0.99)
    assert group["k"] == ("huber" if name == "lion_k" else "l1")
    if name == "lion_k":
        assert group["delta"] == 0.01


@pytest.mark.parametrize(
    "override,message",
    [
        ("base_optimizer.k=l3", "base_optimizer.k='l3' is unknown; choose l1, l2, huber"),
        ("base_optimizer.betas=[0.9,1.0]", "base_optimizer.betas=1.0 must be two numbers in [0, 1"),
        ("base_optimizer.lr=0", "base_optimizer.lr=0 must be a finite number > 0"),
        ("base_optimizer.delta=-1", "base_optimizer.delta=-1 must be a finite number > 0"),
    ],
)
def test_bad_lion_keys_are_one_line_and_exit_2(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    code, _, err = run_cli(["base_optimizer=lion_k", override, f"hydra.run.dir={run}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not run.exists()
