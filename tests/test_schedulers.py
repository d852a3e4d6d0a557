from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from sam_runner.errors import UserError
from sam_runner.schedulers import build_scheduler, lr_factor


def test_cosine_with_warmup():
    cfg = OmegaConf.create({"name": "cosine", "warmup_epochs": 1, "min_lr_ratio": 0.0})
    f = [lr_factor(cfg, s, 10, 100) for s in range(100)]
    assert f[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert f[10] == pytest.approx(1.0)
    assert f[55] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


def test_multistep():
    cfg = OmegaConf.create({"name": "multistep", "milestones": [2, 4], "gamma": 0.1})
    assert [lr_factor(cfg, s, 10, 60) for s in (0, 19, 20, 39, 40)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01]
    )


def test_scheduler_drives_the_optimizer_lr():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.2)
    sched = build_scheduler(OmegaConf.create({"name": "constant", "warmup_epochs": 2}), opt, 5, 50)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert (
        lrs[0] == pytest.approx(0.02)
        and lrs[9] == pytest.approx(0.2)
        and lrs[11] == pytest.approx(0.2)
    )


def test_unknown_scheduler():
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(UserError, match="scheduler='poly'"):
        build_scheduler(OmegaConf.create({"name": "poly"}), torch.optim.SGD([p], lr=0.1), 5, 50)


def _lrs(cfg, steps, state=None):
    """The lr of each of ``steps`` optimizer steps, and the state to resume from after them."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = build_scheduler(cfg, opt, 10, 100)
    if state is not None:
        opt.load_state_dict(state[0])
        sched.load_state_dict(state[1])
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs, (opt.state_dict(), sched.state_dict()), opt.param_groups[0]["lr"]


def test_cosine_ends_at_min_lr_ratio_and_resumes_exactly():
    cfg = OmegaConf.create({"name": "cosine", "warmup_epochs": 1, "min_lr_ratio": 0.1})
    whole, _, final = _lrs(cfg, 100)
    assert final == pytest.approx(0.1 * 0.1) and whole[-1] > final
    first, state, _ = _lrs(cfg, 37)
    rest, _, _ = _lrs(cfg, 63, state)
    assert first + rest == whole


def test_multistep_final_lr():
    cfg = OmegaConf.create(
        {"name": "multistep", "milestones": [3, 6], "gamma": 0.5, "warmup_epochs": 0}
    )
    assert _lrs(cfg, 100)[2] == pytest.approx(0.1 * 0.25)


@pytest.mark.parametrize(
    "conf,match",
    [
        ({"name": "cosine", "min_lr_ratio": 2}, "scheduler.min_lr_ratio=2 must be a fraction in"),
        ({"name": "multistep", "gamma": "x"}, "scheduler.gamma='x' must be a finite number > 0"),
        (
            {"name": "multistep", "milestones": 60},
            "scheduler.milestones=60 must be a list of epochs",
        ),
        (
            {"name": "cosine", "warmup_epochs": -1},
            "scheduler.warmup_epochs=-1 must be a number of epochs >= 0",
        ),
    ],
)
def test_bad_scheduler_values_are_one_line_errors(conf, match):
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(UserError, match=match):
        build_scheduler(OmegaConf.create(conf), torch.optim.SGD([p], lr=0.1), 5, 50)


def test_absent_keys_take_their_defaults_in_a_struct_config():
    """Hydra configs are struct: reading an absent key raises, so only cfg.get may touch it."""
    cfg = OmegaConf.create({"name": "cosine"})
    OmegaConf.set_struct(cfg, True)
    p = torch.nn.Parameter(torch.zeros(1))
    build_scheduler(cfg, torch.optim.SGD([p], lr=0.1), 5, 50)


@pytest.mark.parametrize("name", ["constant", "cosine", "multistep"])
def test_the_runner_s_scheduler_steps_exactly_as_torch_s_lambda_lr(name):
    cfg = OmegaConf.create({"name": name, "warmup_epochs": 1, "milestones": [2, 4]})
    seen = []
    for ours in (True, False):
        groups = [{"params": [torch.nn.Parameter(torch.ones(2))]},
                  {"params": [torch.nn.Parameter(torch.ones(1))], "lr": 0.3}]  # fmt: skip
        opt = torch.optim.SGD(groups, lr=0.1)
        sched = build_scheduler(cfg, opt, 5, 30)
        if not ours:  # torch's own, on the same factor
            sched = torch.optim.lr_scheduler.LambdaLR(opt, sched.lr_lambdas[0])
        trace = []
        for _ in range(30):
            opt.step()
            sched.step()
            trace.append(([g["lr"] for g in opt.param_groups], sched.get_last_lr()))
        state = {k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}
        seen.append((trace, state))
    assert seen[0] == seen[1]  # the same floats, bit for bit, and the same saved state
