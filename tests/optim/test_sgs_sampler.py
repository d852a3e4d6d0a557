"""The SGS sampler (sam_runner/samplers.py): Δ_c from the two passes, its EMA, the class
weights (n_c + 1)^(−α) exp(−λ ẑ(S_c)), the loader's per-example weights, resume."""
import math

import pytest
import torch

from sam_runner.data import TensorLoader
from sam_runner.errors import UserError
from sam_runner.samplers import SGSSampler, build_sampler


def _loader(y):
    return TensorLoader(torch.zeros(len(y), 1), y, 4, shuffle=True, drop_last=True)


def _step(s, targets, loss0, loss1, micro=1):
    """One SAM step as the runner reports it: every micro-batch of pass 0, then of pass 1."""
    for p, losses in ((0, loss0), (1, loss1)):
        for t, l in zip(targets.chunk(micro), torch.tensor(losses).chunk(micro)):
            s.observe(p, None, t, l)


def test_sgs_weights_follow_the_formula():
    y = torch.tensor([0, 0, 0, 1, 1, 2])
    s = SGSSampler(3, alpha=0.5, lam=0.5, beta=0.9)
    t1, t2 = torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 0])
    _step(s, t1, [1.0, 2.0, 1.0, 1.0], [1.5, 2.5, 1.2, 3.0])     # Δ = (0.5, 0.2, 2.0)
    _step(s, t2, [1.0, 1.0, 1.0, 1.0], [1.1, 1.4, 1.0, 1.3], micro=2)  # Δ = (0.2, 0.2, —)
    loader = _loader(y)
    s.end_epoch(loader)
    S = torch.tensor([0.9 * 0.5 + 0.1 * 0.2, 0.9 * 0.2 + 0.1 * 0.2, 2.0])
    n = torch.tensor([4.0, 3.0, 1.0])
    z = (S - S.mean()) / S.std(unbiased=False)
    w = (n + 1) ** -0.5 * torch.exp(-0.5 * z)
    torch.testing.assert_close(s.class_weights, w)
    torch.testing.assert_close(loader.weights, w[y])
    assert s.log_values()["sgs_weight_ratio"] == pytest.approx((w.max() / w.min()).item())


def test_sgs_pairs_a_perturbing_step_with_its_own_first_pass():
    """Plain steps (interval > 1) leave pass-0 records only: they count but teach no Δ."""
    s = SGSSampler(2, beta=0.0)
    s.observe(0, None, torch.tensor([0, 1]), torch.tensor([9.0, 9.0]))      # a plain step
    _step(s, torch.tensor([0, 1]), [1.0, 1.0], [2.0, 1.5])
    s.end_epoch(None)
    torch.testing.assert_close(s.sharpness, torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(s.counts, torch.tensor([2.0, 2.0]))


def test_sgs_resume_restores_the_loader_weights():
    y = torch.tensor([0, 1, 1, 1])
    s = SGSSampler(2, loader=_loader(y))
    _step(s, torch.tensor([0, 1]), [1.0, 1.0], [2.0, 1.5])
    s.end_epoch(s.loader)
    fresh = SGSSampler(2, loader=_loader(y))
    fresh.load_state_dict(s.state_dict())
    torch.testing.assert_close(fresh.loader.weights, s.loader.weights)
    assert len(list(fresh.loader)) == 1   # the weighted loader still yields full batches


def test_sgs_rarely_sampled_and_sharp_classes_are_drawn_less_or_more_as_designed():
    """Equal sharpness: the rarer class gets the larger weight. Equal counts: the sharper one the smaller."""
    s = SGSSampler(2)
    _step(s, torch.tensor([0, 0, 0, 1]), [1.0] * 4, [1.1] * 4)
    s.end_epoch(None)
    assert s.class_weights[1] > s.class_weights[0]
    s = SGSSampler(2)
    _step(s, torch.tensor([0, 1]), [1.0, 1.0], [1.1, 3.0])
    s.end_epoch(None)
    assert s.class_weights[1] < s.class_weights[0]
    assert math.isclose(float(s.class_weights[0] / s.class_weights[1]), math.exp(0.5 * 2), rel_tol=1e-5)


class _Cfg(dict):
    def __getattr__(self, k):
        return self[k]


def test_sgs_config_errors():
    data = type("D", (), {"train": _loader(torch.tensor([0, 1])), "num_classes": 2})()
    with pytest.raises(UserError, match="unknown keys"):
        build_sampler(_Cfg(name="mnist1d", sampler="sgs", sgs={"alpah": 1.0}), data)
    with pytest.raises(UserError, match="alpha"):
        build_sampler(_Cfg(name="mnist1d", sampler="sgs", sgs={"alpha": -1.0}), data)
    with pytest.raises(UserError, match="in-memory"):
        build_sampler(_Cfg(name="image_folder", sampler="sgs"), type("D", (), {"train": object(), "num_classes": 2})())
    assert isinstance(build_sampler(_Cfg(name="mnist1d", sampler="sgs"), data), SGSSampler)
