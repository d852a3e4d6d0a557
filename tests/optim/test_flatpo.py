"""FlatPO against its formula: SAM on the ⌈fraction·N⌉ coordinates of largest Fisher diagonal
(EMA of g²), the mask kept between refreshes; SAM itself, bit for bit, with fraction = 1."""

import math

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad


def steps(opt, model, n, record=None):
    for _ in range(n):
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        if record is not None:
            record.append(seen)


def test_fraction_one_is_sam_bit_for_bit():
    a, b = mlp(seed=4), mlp(seed=4)
    sam = build("sam", a, lr=0.1, momentum=0.9, rho=0.05)
    flatpo = build("flatpo", b, lr=0.1, momentum=0.9, rho=0.05, fraction=1.0, refresh_every=1)
    for _ in range(5):
        sam.step(closure_for(sam, a))
        flatpo.step(closure_for(flatpo, b))
        assert torch.equal(flat(a.parameters()), flat(b.parameters()))


def test_the_perturbation_is_on_the_sharpest_coordinates_and_the_mask_waits_for_a_refresh():
    model = mlp(seed=2)
    rho, fraction, beta = 0.07, 0.2, 0.5
    opt = build("flatpo", model, lr=0.1, rho=rho, fraction=fraction, refresh_every=2, beta=beta)
    seen = []
    fisher, mask = None, None
    for step in range(4):
        theta = flat(model.parameters())
        steps(opt, model, 1, seen)
        _, g = ref_grad(model, theta)
        fisher = g.square() if fisher is None else beta * fisher + (1 - beta) * g.square()
        if step % 2 == 0:  # a refresh: the top ⌈f·N⌉ coordinates of F
            k = math.ceil(fraction * g.numel())
            mask = torch.zeros_like(g)
            mask[torch.topk(fisher, k).indices] = 1
        expected = rho * mask * g / (mask * g).norm()
        eps = seen[-1][1] - theta
        torch.testing.assert_close(eps, expected, rtol=1e-9, atol=1e-12)
        assert int((eps != 0).sum()) == int(mask.sum()) == math.ceil(fraction * g.numel())
        assert eps.norm().item() == pytest.approx(rho, rel=1e-12)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, True])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match=r"fraction=.* must be a number in \(0, 1\]"):
        build("flatpo", mlp(), fraction=fraction)
