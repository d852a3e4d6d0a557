"""input_grad_norm against a per-sample loop."""

import pytest
import torch
from torch import nn

from sam_runner.metrics.input_grad import input_grad_norm


def test_equal_to_a_per_sample_loop():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 3, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Flatten(), nn.Linear(18, 4)
    )
    model.train()
    model(torch.randn(16, 1, 8))  # running statistics; a training-mode pass would mix samples
    x, y = torch.randn(10, 1, 8), torch.randint(0, 4, (10,))
    batches = [(x[:6], y[:6], None), (x[6:], y[6:], None)]
    loop = []
    model.eval()
    for i in range(10):
        xi = x[i : i + 1].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(nn.functional.cross_entropy(model(xi), y[i : i + 1]), xi)
        loop.append(float(g.norm()))
    model.train()
    assert input_grad_norm(model, batches) == pytest.approx(sum(loop) / 10, rel=1e-6)
    assert input_grad_norm(model, batches, num_samples=7) == pytest.approx(sum(loop[:7]) / 7)
    assert model.training  # its mode is restored
