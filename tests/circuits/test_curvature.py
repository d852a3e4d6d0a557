"""The exact Hessian trace against a dense float64 autograd Hessian in the sum weights, its
per-node decomposition, the edge terms, and the generic estimators on the weight view."""

from __future__ import annotations

import pytest
import torch

from sam_runner.circuits.circuit import ProbabilisticCircuit
from sam_runner.circuits.curvature import (
    WeightView,
    edge_curvature,
    hessian_trace,
    node_curvature,
    trace_by_depth,
)
from sam_runner.metrics import hessian_trace as hutchinson_trace
from sam_runner.metrics import top_hessian_eigenvalues
from sam_runner.metrics.hvp import HessianOperator


def small_circuit(seed=0, num_vars=6, categories=2, depth=2, units=2, reps=2):
    torch.manual_seed(seed)
    pc = ProbabilisticCircuit(num_vars, categories, depth, units, reps).double()
    x = torch.randint(0, categories, (40, num_vars))
    return pc, x


def dense_hessian(pc, x) -> torch.Tensor:
    """The Hessian of the mean log-likelihood in the flat vector of every sum weight."""
    weights = [w.detach() for w in pc.weights()]
    sizes = [w.numel() for w in weights]

    def mean_ll(flat):
        parts = [p.view_as(w) for p, w in zip(flat.split(sizes), weights)]
        return pc.evaluate(x, parts, leaf_grad=False).ll.mean()

    return torch.autograd.functional.hessian(mean_ll, torch.cat([w.flatten() for w in weights]))


@pytest.mark.parametrize(
    "kwargs", [{}, dict(depth=1, units=3), dict(num_vars=8, depth=3, categories=3)]
)
def test_the_closed_form_trace_equals_the_dense_hessians(kwargs):
    pc, x = small_circuit(**kwargs)
    dense = torch.trace(dense_hessian(pc, x)).item()
    exact = hessian_trace(pc, [x[:15], x[15:]])  # batches: the mean over all examples
    assert dense < 0
    assert exact == pytest.approx(dense, rel=1e-10)


def test_the_per_node_terms_sum_to_the_trace_and_factorise_into_flow_and_local_term():
    pc, x = small_circuit(num_vars=8, depth=3)
    nodes = node_curvature(pc, [x])
    by_depth = trace_by_depth(pc, [x])
    assert sum(by_depth) == pytest.approx(hessian_trace(pc, [x]), rel=1e-12)
    diag = -torch.diagonal(dense_hessian(pc, x))
    sizes = [w.numel() for w in pc.weights()]
    for t, (edges, (flow, term)) in enumerate(zip(diag.split(sizes), nodes)):
        per_node = edges.view(pc.weight_shape(t)).sum(-1)  # a node's edges: its share of −tr H
        assert torch.allclose(term, per_node, rtol=1e-10)
        assert by_depth[t] == pytest.approx(-per_node.sum().item(), rel=1e-10)
        assert (flow <= 1 + 1e-12).all() and (flow > 0).all()  # a flow is a probability squared
    assert nodes[0][0].item() == pytest.approx(1.0)  # the root is in every induced tree


def test_edge_terms_are_minus_the_hessians_diagonal():
    pc, x = small_circuit(categories=3)
    diag = -torch.diagonal(dense_hessian(pc, x)) * len(x)
    edges = torch.cat([e.flatten() for e in edge_curvature(pc, x)])
    assert torch.allclose(edges, diag, rtol=1e-10)


def nll(out, _y):
    return -out.mean()


def test_lanczos_on_the_weight_view_equals_the_dense_top_eigenvalue():
    pc, x = small_circuit()
    dense = torch.linalg.eigvalsh(-dense_hessian(pc, x))[-1].item()  # of the loss: −mean ll
    y = torch.zeros(len(x), dtype=torch.long)
    got = top_hessian_eigenvalues(WeightView(pc), nll, [(x, y)], k=1, tol=1e-8, max_iter=200)
    assert got[0] == pytest.approx(dense, rel=1e-6)


def test_hutchinson_on_the_weight_view_agrees_with_the_exact_trace():
    pc, x = small_circuit()
    y = torch.zeros(len(x), dtype=torch.long)
    with HessianOperator(WeightView(pc), nll, [(x, y)]) as op:
        estimate, se = hutchinson_trace(op, num_probes=400, seed=0)
    exact = -hessian_trace(pc, [x])  # the loss's Hessian: minus the log-likelihood's
    assert abs(estimate - exact) <= 4 * se + 1e-9
    assert se < 0.2 * exact


def test_the_weight_view_follows_the_circuit_when_its_mode_is_set():
    pc, x = small_circuit()
    view = WeightView(pc)
    with torch.no_grad():
        pc.sum_logits[0].add_(torch.randn_like(pc.sum_logits[0]))
    assert not torch.allclose(view(x), pc(x))
    view.eval()
    assert torch.allclose(view(x), pc(x), rtol=1e-12)
