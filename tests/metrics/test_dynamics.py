"""The dynamics a measurement logs: the SAM edge of stability, checked on a quadratic where it
is exact, and the gradient's share in the top-k eigenspace, against a dense eigendecomposition."""

import math

import pytest
import torch
from metrics_helpers import dense_hessian
from omegaconf import OmegaConf
from torch import nn

from sam_runner.data import Data
from sam_runner.losses import mean_loss
from sam_runner.metrics.stability import sam_edge
from sam_runner.metrics.tracker import CurvatureTracker
from sam_runner.optim import SAM, Base


class Quadratic(nn.Module):
    """L = ½ λ x² + c·y: curvature λ along x, and a gradient of norm ≈ c kept by y."""

    def __init__(self, lam, c):
        super().__init__()
        self.x = nn.Parameter(torch.tensor([1e-6], dtype=torch.float64))
        self.y = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        self.lam, self.c = lam, c

    def forward(self):
        return 0.5 * self.lam * self.x.square().sum() + self.c * self.y.sum()


def sam_on_the_quadratic(lam, c=1.0, lr=0.1, rho=0.05, steps=200) -> float:
    model = Quadratic(lam, c)
    opt = SAM(model.parameters(), torch.optim.SGD, lr=lr, rho=rho).bind(model=model)

    def closure():
        opt.zero_grad()
        loss = model()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return abs(model.x.item())


def test_sam_edge_is_where_sam_on_a_quadratic_starts_to_diverge():
    """Along x SAM multiplies x by 1 − ηλ(1 + ρλ/‖g‖), ‖g‖ ≈ c: stable below the edge
    (‖g‖/(2ρ))(√(1 + 8ρ/(η‖g‖)) − 1), unstable above it; the edge lies below 2/η."""
    lr, rho, c = 0.1, 0.05, 1.0
    opt = SAM([nn.Parameter(torch.zeros(1))], torch.optim.SGD, lr=lr, rho=rho)
    edge = sam_edge(opt, c)
    assert edge == pytest.approx((c / (2 * rho)) * (math.sqrt(1 + 8 * rho / (lr * c)) - 1))
    assert edge < 2 / lr
    assert lr * edge * (1 + rho * edge / c) == pytest.approx(2.0)  # the stability condition's root
    assert sam_on_the_quadratic(0.97 * edge) < 1e-7  # decays from 1e-6
    assert sam_on_the_quadratic(1.03 * edge) > 1e-5  # grows


def test_sam_edge_applies_to_sam_with_plain_sgd_only():
    p = [nn.Parameter(torch.zeros(1))]
    assert sam_edge(SAM(p, torch.optim.SGD, lr=0.1, momentum=0.9), 1.0) is None
    assert sam_edge(Base(p, torch.optim.SGD, lr=0.1), 1.0) is None
    assert sam_edge(SAM(p, torch.optim.SGD, lr=0.1, rho=0.0), 1.0) is None
    assert sam_edge(SAM(p, torch.optim.SGD, lr=0.1, rho=1e-9), 1.0) == pytest.approx(20.0, rel=1e-6)


def test_grad_topk_overlap_equals_the_dense_projection():
    """‖P_k g‖²/‖g‖² with P_k from this measurement's Ritz vectors (k = 3) equals the projection
    onto the top-3 eigenvectors of the dense Hessian; with a full batch the subset is the
    training set."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 4)).double()
    x, y = torch.randn(60, 6, dtype=torch.float64), torch.randint(0, 4, (60,))
    data = Data(
        train=None,
        test=None,
        num_classes=4,
        input_shape=(6,),
        train_size=60,
        train_tensors=(x, y),
        full_batch=True,
    )
    cfg = OmegaConf.create(
        {
            "hessian": {
                "k": 3,
                "tol": 1e-8,
                "max_iter": 200,
                "num_samples": 20,
                "grad_topk_overlap": True,
            }
        }
    )
    loss = mean_loss("mse")
    tracker = CurvatureTracker(
        cfg, model, data, Base(model.parameters(), torch.optim.SGD, lr=0.1), 0, loss_fn=loss
    )
    out = tracker.measure(final=True)
    assert tracker.num_samples() == 60
    values, vectors = torch.linalg.eigh(dense_hessian(model, loss, x, y))
    top = vectors[:, -3:]
    g = torch.cat(
        [t.reshape(-1) for t in torch.autograd.grad(loss(model(x), y), list(model.parameters()))]
    )
    expected = float((top.T @ g).square().sum() / g.square().sum())
    assert out["grad_topk_overlap"] == pytest.approx(expected, rel=1e-6)
    assert out["lambda_max"] == pytest.approx(float(values[-1]), rel=1e-7)
    assert out["eos_threshold"] == pytest.approx(20.0) and "sam_edge" not in out


@pytest.mark.parametrize("full_batch", [True, False])
def test_the_sam_edge_is_logged_for_full_batch_sam_only(full_batch):
    """With a full batch the edge uses the training gradient's norm; with mini-batches the steps
    face their own batches' gradients, so no edge is claimed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 4)).double()
    x, y = torch.randn(40, 6, dtype=torch.float64), torch.randint(0, 4, (40,))
    data = Data(None, None, 4, (6,), 40, train_tensors=(x, y), full_batch=full_batch)
    cfg = OmegaConf.create({"hessian": {"k": 1, "tol": 1e-8, "max_iter": 100, "num_samples": 40}})
    loss = mean_loss("mse")
    opt = SAM(model.parameters(), torch.optim.SGD, lr=0.1, rho=0.05)
    out = CurvatureTracker(cfg, model, data, opt, 0, loss_fn=loss).measure(final=True)
    if not full_batch:
        assert "sam_edge" not in out and "sam_edge_ratio" not in out
        return
    grads = torch.autograd.grad(loss(model(x), y), list(model.parameters()))
    g = float(torch.cat([t.reshape(-1) for t in grads]).norm())
    assert out["grad_norm"] == pytest.approx(g, rel=1e-9)
    assert out["sam_edge"] == pytest.approx(sam_edge(opt, g), rel=1e-12)
    assert out["sam_edge_ratio"] == pytest.approx(out["lambda_max"] / out["sam_edge"])
