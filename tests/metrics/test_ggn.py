"""The Gauss–Newton part of the Hessian, the rest, and the Hessian per block: each against a
dense float64 reference on a tiny model (two batches of unequal size), and in a real run."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, compose
from metrics_helpers import dense_hessian
from torch import nn

from sam_runner.metrics.ggn import block_eigenvalues, ggn_eigenvalues, ggn_product
from sam_runner.metrics.hvp import HessianOperator
from sam_runner.train import train

TIGHT = dict(tol=1e-9, max_iter=200)


def _loss(out, y):
    return F.cross_entropy(out, y, reduction="none")


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    model = model.double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(11, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (11,), generator=g)
    batches = [(x[:7], y[:7]), (x[7:], y[7:])]
    return model, x, y, batches


def _dense_ggn(model, x, y):
    """Σ_i (1/N) J_iᵀ (diag(p_i) − p_i p_iᵀ) J_i, J_i the outputs' Jacobian for sample i."""
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach() for p in model.parameters()]
    sizes = [p.numel() for p in params]
    flat = torch.cat([p.reshape(-1) for p in params])

    def f(v):
        chunks = [c.view_as(p) for c, p in zip(v.split(sizes), params)]
        return torch.func.functional_call(model, dict(zip(names, chunks)), (x,))

    jac = torch.autograd.functional.jacobian(f, flat)  # [N, C, P]
    p = torch.softmax(f(flat), dim=1)
    h_out = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("ncp,ncd,ndq->pq", jac, h_out, jac) / len(y)


def test_ggn_product_equals_the_dense_matrix():
    model, x, y, batches = _setup()
    G = _dense_ggn(model, x, y)
    with HessianOperator(model, _loss, batches) as op:
        for seed in range(3):
            v = torch.randn(op.numel, generator=torch.Generator().manual_seed(seed)).double()
            torch.testing.assert_close(ggn_product(op, v), G @ v, rtol=1e-10, atol=1e-12)


def test_ggn_and_residual_eigenvalues_equal_the_dense_ones():
    model, x, y, batches = _setup()
    G = _dense_ggn(model, x, y)
    H = dense_hessian(model, lambda out, t: F.cross_entropy(out, t), x, y)
    with HessianOperator(model, _loss, batches) as op:
        got = ggn_eigenvalues(op, **TIGHT)
    assert got["lambda_max_ggn"] == pytest.approx(float(torch.linalg.eigvalsh(G)[-1]), rel=1e-7)
    want_r = float(torch.linalg.eigvalsh(H - G)[-1])
    assert got["lambda_max_residual"] == pytest.approx(want_r, rel=1e-7)
    # G is positive semi-definite; H − G is not (its negative part is the outputs' curvature)
    assert float(torch.linalg.eigvalsh(G)[0]) > -1e-12 > float(torch.linalg.eigvalsh(H - G)[0])


def test_block_eigenvalues_equal_the_dense_diagonal_blocks():
    model, x, y, batches = _setup()
    H = dense_hessian(model, lambda out, t: F.cross_entropy(out, t), x, y)
    spans, at = {}, 0
    for name, p in model.named_parameters():
        block = name.split(".")[0]
        spans.setdefault(block, []).extend(range(at, at + p.numel()))
        at += p.numel()
    with HessianOperator(model, _loss, batches) as op:
        got = block_eigenvalues(op, **TIGHT)
    assert set(got) == {"lambda_max_block_0", "lambda_max_block_2", "lambda_max_block_4"}
    for block, idx in spans.items():
        want = float(torch.linalg.eigvalsh(H[idx][:, idx])[-1])
        assert got[f"lambda_max_block_{block}"] == pytest.approx(want, rel=1e-7), block


def test_a_run_logs_the_ggn_and_block_eigenvalues(tmp_path):
    cfg = compose(
        *TINY, "model=mlp", "model.hidden=[8]", "metrics.ggn.enabled=true",
        "metrics.blocks.enabled=true", "metrics.ggn.num_samples=100000",
        "metrics.blocks.num_samples=100000",
    )  # fmt: skip
    train(cfg, tmp_path, [])
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    blocks = [k for k in row if k.startswith("lambda_max_block_")]
    assert row["lambda_max_ggn"] > 0 and "lambda_max_residual" in row and blocks
    # each diagonal block's top eigenvalue is at most the whole Hessian's (Cauchy interlacing)
    assert all(row[k] <= row["lambda_max"] * (1 + 1e-2) for k in blocks)
