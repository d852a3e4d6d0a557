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
    assert [lr_factor(cfg, s, 10, 60) for s in (0, 19, 20, 39, 40)] == pytest.approx([1, 1, 0.1, 0.1, 0.01])


def test_scheduler_drives_the_optimizer_lr():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.2)
    sched = build_scheduler(OmegaConf.create({"name": "constant", "warmup_epochs": 2}), opt, 5, 50)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.02) and lrs[9] == pytest.approx(0.2) and lrs[11] == pytest.approx(0.2)


def test_unknown_scheduler():
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(UserError, match="scheduler='poly'"):
        build_scheduler(OmegaConf.create({"name": "poly"}), torch.optim.SGD([p], lr=0.1), 5, 50)
