"""Weight quantization: bit-equal to PyTorch's fake quantization; the predicted loss rise exact
in expectation on a quadratic."""

import pytest
import torch
from torch import nn

from sam_runner.metrics.hvp import HessianOperator
from sam_runner.metrics.quantization import predicted_rise, quantize_weights, rounding_steps


@pytest.mark.parametrize("bits", [2, 4, 8, 16])
def test_equal_to_fake_quantize_per_channel(bits):
    torch.manual_seed(bits)
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.Flatten(), nn.Linear(20, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        model[0].weight[2].zero_()  # a channel of zeros stays zero
    q = quantize_weights(model, bits)
    levels = 2 ** (bits - 1) - 1
    for i in (0, 2):
        w = model[i].weight.detach()
        scale = w.reshape(len(w), -1).abs().amax(1) / levels
        scale = torch.where(scale > 0, scale, torch.ones_like(scale)).float()
        zero = torch.zeros(len(w), dtype=torch.int32)
        ref = torch.fake_quantize_per_channel_affine(w, scale, zero, 0, -levels, levels)
        assert torch.equal(q[i].weight, ref)
        assert len(torch.unique(q[i].weight[1])) <= 2 * levels + 1
    for a, b in ((model[0].bias, q[0].bias), (model[3].weight, q[3].weight)):
        assert torch.equal(a, b)  # biases and normalization untouched
    assert torch.equal(model[3].running_mean, q[3].running_mean)
    assert not torch.equal(model[2].weight, q[2].weight)  # the original is not changed


def test_bad_bit_width():
    with pytest.raises(ValueError, match="bits=1 must be an integer in 2..16"):
        quantize_weights(nn.Linear(2, 2), 1)


def test_predicted_rise_is_the_expected_rise_of_a_quadratic():
    # linear least squares at its minimum: the loss is exactly quadratic in the weights, its
    # gradient 0, so E[L(w + δ)] − L(w) = ½ Σ H_ii E δ_i² = Σ H_ii s_i²/24 for uniform δ
    torch.manual_seed(0)
    x, t = torch.randn(64, 6, dtype=torch.float64), torch.randn(64, 3, dtype=torch.float64)
    model = nn.Linear(6, 3, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.linalg.lstsq(x, t).solution.T)

    def loss_fn(out, y):
        return 0.5 * (out - y).square().sum(1)

    batches = [(x, t)]
    with HessianOperator(model, loss_fn, batches) as op:
        exact = predicted_rise(op, model, [4], exact_max_params=10_000, num_probes=2, seed=0)[4]
        hutch = predicted_rise(op, model, [4], exact_max_params=0, num_probes=4000, seed=1)[4]
    steps = rounding_steps(model, list(model.parameters()), 4)[0]
    base = float(loss_fn(model(x), t).mean().detach())
    g = torch.Generator().manual_seed(2)
    rises = []
    with torch.no_grad():
        w = model.weight.clone()
        for _ in range(4000):
            delta = (torch.rand(w.shape, generator=g, dtype=torch.float64) - 0.5) * steps
            rises.append(float(loss_fn(x @ (w + delta).T, t).mean()) - base)
    mc = torch.tensor(rises)
    assert exact == pytest.approx(float(mc.mean()), abs=4 * float(mc.std()) / 4000**0.5)
    assert hutch == pytest.approx(exact, rel=0.1)
