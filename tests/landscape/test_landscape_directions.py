"""Directions: filter normalization (Li et al. 2018), seeding, Hessian eigenvectors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from sam_runner.landscape.directions import (
    filter_normalized,
    hessian_directions,
    norm,
    trainable,
    weight_norm,
)
from sam_runner.metrics.hvp import HessianOperator
from sam_runner.models import build_model


def cnn():
    torch.manual_seed(0)
    return build_model(OmegaConf.create({"arch": "cnn1d", "channels": 8}), (1, 40), 10).eval()


def mlp():
    torch.manual_seed(0)
    return build_model(OmegaConf.create({"arch": "mlp", "hidden": [16]}), (1, 40), 10).eval()


@pytest.mark.parametrize("make", [cnn, mlp])
def test_each_filter_has_the_norm_of_its_weight_filter_and_biases_and_bn_are_zero(make):
    model = make()
    d = filter_normalized(model, seed=3)
    checked = 0
    for p, dp in zip(trainable(model), d):
        assert dp.shape == p.shape
        if p.dim() <= 1:  # biases, BatchNorm γ and β
            assert torch.count_nonzero(dp) == 0
            continue
        for w_f, d_f in zip(p.detach(), dp):  # one filter: an output channel, a neuron
            assert float(d_f.norm()) == pytest.approx(float(w_f.norm()), rel=1e-5)
            checked += 1
    assert checked == sum(len(p) for p in trainable(model) if p.dim() > 1)
    assert norm(d) == pytest.approx(weight_norm(model), rel=1e-5)


def test_biases_and_bn_included_on_request_with_their_own_norm_and_weights_unchanged():
    model = cnn()
    plain, both = filter_normalized(model, 5), filter_normalized(model, 5, include_bias_bn=True)
    for p, a, b in zip(trainable(model), plain, both):
        if p.dim() > 1:
            assert torch.equal(a, b)  # the weights' filters are drawn alike either way
        else:
            assert float(b.norm()) == pytest.approx(float(p.detach().norm()), rel=1e-5)
    assert norm(both) == pytest.approx(weight_norm(model, include_bias_bn=True), rel=1e-5)


def test_the_same_seed_draws_the_same_direction_and_another_seed_another():
    model = cnn()
    a, b, c = filter_normalized(model, 7), filter_normalized(model, 7), filter_normalized(model, 8)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, z) for x, z in zip(a, c))


def test_hessian_directions_are_the_top_eigenvectors_scaled_to_the_weight_norm():
    model = mlp()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 40, generator=g), torch.randint(0, 10, (64,), generator=g)
    options = {"tol": 1e-6, "max_iter": 200, "method": "double_backward", "graph_cache_mb": 64}
    dirs, values, info = hessian_directions(model, F.cross_entropy, [(x, y)], 2, 0, options, 5.0)
    assert info["converged"] and values[0] >= values[1]
    with HessianOperator(model, F.cross_entropy, [(x, y)], "double_backward") as op:
        theta = op.flat([p.detach() for p in op.params])
        for d, lam in zip(dirs, values):
            v = op.flat(d)
            assert float(v.norm()) == pytest.approx(5.0, rel=1e-5)
            assert float(torch.dot(v, theta)) >= 0  # the sign convention
            hv = op(v / v.norm())
            assert float((hv - lam * v / v.norm()).norm()) <= 1e-3 * abs(lam)
