"""Jiang et al.'s complexity measures against direct computations, and the BatchNorm fold."""

import math

import pytest
import torch
from torch import nn

from sam_runner.metrics.complexity import complexity_measures, fold_batchnorm, path_norm


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def test_measures_equal_direct_computations():
    model = mlp()
    start = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}
    out = complexity_measures(model, (5,), start)
    w1, b1, w2, b2 = (p.detach().double() for p in model.parameters())
    assert out["param_norm"] == pytest.approx(float(w1.square().sum() + w2.square().sum()))
    s1, s2 = start["0.weight"].double(), start["2.weight"].double()
    assert out["dist_from_init"] == pytest.approx(
        float((w1 - s1).square().sum() + (w2 - s2).square().sum())
    )
    # Σ over paths of the squared weights' product, biases as paths from a constant 1
    hidden = w1.square() @ torch.ones(5, dtype=torch.float64) + b1.square()
    assert out["path_norm"] == pytest.approx(float((w2.square() @ hidden + b2.square()).sum()))
    spec = [torch.linalg.svdvals(w)[0] for w in (w1, w2)]
    assert out["spectral_norm_product"] == pytest.approx(sum(2 * math.log(s) for s in spec))


def test_no_dist_from_init_without_the_initial_weights():
    assert "dist_from_init" not in complexity_measures(mlp(), (5,), None)


def test_conv_kernels_are_reshaped_to_matrices():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 2))
    out = complexity_measures(model, (2, 4, 4))
    k = model[0].weight.detach().double().reshape(3, -1)
    w = model[2].weight.detach().double()
    expected = 2 * math.log(torch.linalg.svdvals(k)[0]) + 2 * math.log(torch.linalg.svdvals(w)[0])
    assert out["spectral_norm_product"] == pytest.approx(expected)


def test_fold_keeps_the_function_and_moves_the_scale_into_the_layer():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU())
    model.train()
    for _ in range(3):  # running statistics away from their start
        model(torch.randn(8, 2, 6, 6) * 3 + 1)
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 2.0)
        model[1].bias.uniform_(-1, 1)
    model.eval()
    folded = fold_batchnorm(model)
    x = torch.randn(5, 2, 6, 6)
    torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)
    scale = model[1].weight / (model[1].running_var + model[1].eps).sqrt()
    torch.testing.assert_close(folded[0].weight, model[0].weight * scale.view(-1, 1, 1, 1))
    assert model.training is False and model[0].bias is None  # the original is untouched


def test_path_norm_of_a_folded_batchnorm_network_is_the_plain_networks():
    torch.manual_seed(3)
    plain = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with_bn = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    with_bn[0].load_state_dict(plain[0].state_dict())
    with_bn[3].load_state_dict(plain[2].state_dict())
    with_bn.eval()  # fresh statistics: the BatchNorm only divides by √(1 + eps)
    with torch.no_grad():
        for p in plain[0].parameters():
            p.div_((1 + with_bn[1].eps) ** 0.5)
    assert path_norm(fold_batchnorm(with_bn), (3,)) == pytest.approx(path_norm(plain, (3,)))
