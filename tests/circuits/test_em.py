"""Mini-batch EM against a float64 transcription on a hand-built circuit; the regularized
updates (weight 0 is plain EM; the update lowers the regularized objective) and their gradient
forms."""

from __future__ import annotations

import itertools

import pytest
import torch

from sam_runner.circuits.circuit import ProbabilisticCircuit
from sam_runner.circuits.curvature import hessian_trace, node_curvature
from sam_runner.circuits.em import EM
from sam_runner.circuits.regularizers import CircuitRegularizer


def hand_built():
    """Two binary variables, one leaf region each with two Bernoulli units, the root over the
    four products; every probability set by hand."""
    pc = ProbabilisticCircuit(2, 2, depth=1, sum_units=2, repetitions=1).double()
    leaf = torch.tensor([[[0.2, 0.8], [0.7, 0.3]], [[0.6, 0.4], [0.1, 0.9]]], dtype=torch.float64)
    root = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    with torch.no_grad():
        pc.leaf_logits.copy_(leaf.log()[None])
        pc.sum_logits[0].copy_(root.log())
    return pc, leaf.tolist(), root.tolist()


def transcribed_em(leaf, root, region, data, lr):
    """The EM update written out over the induced trees, in Python floats."""
    counts_root, counts_leaf = [0.0] * 4, [[[0.0, 0.0] for _ in range(2)] for _ in range(2)]
    left_var = region.index(0)  # the variable in the left (even) leaf region
    right_var = 1 - left_var
    for x in data:
        terms = {
            (i, j): root[2 * i + j]
            * leaf[left_var][i][x[left_var]]
            * leaf[right_var][j][x[right_var]]
            for i, j in itertools.product(range(2), repeat=2)
        }
        p = sum(terms.values())
        for (i, j), v in terms.items():
            counts_root[2 * i + j] += v / p
            counts_leaf[left_var][i][x[left_var]] += v / p
            counts_leaf[right_var][j][x[right_var]] += v / p
    new_root = [(1 - lr) * w + lr * c / sum(counts_root) for w, c in zip(root, counts_root)]
    new_leaf = [
        [[(1 - lr) * leaf[v][u][k] + lr * counts_leaf[v][u][k] / sum(counts_leaf[v][u])
          for k in range(2)] for u in range(2)]
        for v in range(2)
    ]  # fmt: skip
    return new_root, new_leaf


def em_step(pc, x, lr=1.0, regularizer=None, batches=1):
    opt = EM(pc.parameters(), lr=lr)

    def closure():
        opt.zero_grad()
        total = 0.0
        for part in x.tensor_split(batches):
            out = pc(part)
            loss = -out.mean() * len(part) / len(x)
            if regularizer is not None:
                loss = regularizer.add(loss, pc, part, out, len(part) / len(x))
            loss.backward()
            total += float(loss.detach())
        return total

    opt.step(closure)


@pytest.mark.parametrize("lr", [1.0, 0.3])
def test_em_equals_its_float64_transcription_on_a_hand_built_circuit(lr):
    pc, leaf, root = hand_built()
    data = [(0, 0), (0, 1), (1, 1), (1, 1), (1, 0), (0, 1), (1, 1)]
    region = pc.leaf_index.tolist()
    want_root, want_leaf = transcribed_em(leaf, root, region, data, lr)
    em_step(pc, torch.tensor(data), lr, batches=3)  # three micro-batches: the same step
    got_root = torch.softmax(pc.sum_logits[0], -1)
    got_leaf = torch.softmax(pc.leaf_logits[0], -1)
    assert torch.allclose(got_root, torch.tensor(want_root, dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(got_leaf, torch.tensor(want_leaf, dtype=torch.float64), rtol=1e-12)


def circuit_and_data(seed=0):
    torch.manual_seed(seed)
    pc = ProbabilisticCircuit(8, 2, depth=3, sum_units=2, repetitions=2).double()
    x = (torch.rand(60, 8) < torch.linspace(0.1, 0.9, 8)).long()
    x[:, 1] = x[:, 0]  # some dependence for the mixture to find
    return pc, x


def state(pc):
    return [p.detach().clone() for p in pc.parameters()]


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_regularizer_of_weight_zero_is_plain_em(adaptive):
    pc, x = circuit_and_data()
    plain = ProbabilisticCircuit(8, 2, 3, 2, 2).double()
    plain.load_state_dict(pc.state_dict())
    em_step(plain, x, 0.5)
    em_step(pc, x, 0.5, CircuitRegularizer(0.0, adaptive))
    assert all(torch.equal(a, b) for a, b in zip(state(plain), state(pc)))


def objective(pc, x, reg) -> float:
    with torch.no_grad():
        nll = -pc(x).mean().item()
    return nll + reg.weight * float(reg.penalty(pc, x, create_graph=False))


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("weight,lr", [(0.01, 0.5), (0.05, 0.2), (0.05, 0.5)])
def test_the_regularized_update_lowers_the_regularized_objective(adaptive, weight, lr):
    pc, x = circuit_and_data()
    for _ in range(30):  # near plain EM's fixed point: the likelihood's gradient is ~0 there
        em_step(pc, x, 1.0)
    reg = CircuitRegularizer(weight, adaptive)
    before, sharp_before = objective(pc, x, reg), float(reg.penalty(pc, x, False))
    em_step(pc, x, lr, reg)
    assert objective(pc, x, reg) < before
    for _ in range(4):
        em_step(pc, x, lr, reg)
    assert objective(pc, x, reg) < before
    assert float(reg.penalty(pc, x, False)) < sharp_before  # flatter


def test_the_trace_penalty_is_minus_the_exact_trace_and_its_gradient_is_exact():
    pc, x = circuit_and_data(1)
    reg = CircuitRegularizer(1.0, adaptive=False)
    value = reg.penalty(pc, x)
    assert value.item() == pytest.approx(-hessian_trace(pc, [x]), rel=1e-12)
    grads = torch.autograd.grad(value, list(pc.sum_logits))
    p, i = pc.sum_logits[1], (0, 1, 0, 2)
    eps = 1e-6
    with torch.no_grad():
        p[i] += eps
        up = reg.penalty(pc, x, False).item()
        p[i] -= 2 * eps
        down = reg.penalty(pc, x, False).item()
        p[i] += eps
    assert grads[1][i].item() == pytest.approx((up - down) / (2 * eps), rel=1e-6)


def test_the_adaptive_penalty_is_the_sum_of_the_nodes_local_terms():
    pc, x = circuit_and_data(2)
    nodes = node_curvature(pc, [x])
    want = sum(float((t / f).sum()) for f, t in nodes)
    assert CircuitRegularizer(1.0, True).penalty(pc, x).item() == pytest.approx(want, rel=1e-12)


def test_under_em_the_logits_gradient_is_still_autograds():
    pc, x = circuit_and_data(3)
    loss = -pc(x).mean()
    want = torch.autograd.grad(loss, list(pc.parameters()))
    EM(pc.parameters(), lr=0.5)  # the circuit's statistics now come from its top-down pass
    (-pc(x).mean()).backward()
    for p, g in zip(pc.parameters(), want):
        assert torch.allclose(p.grad, g, rtol=1e-10, atol=1e-14)
        assert p.em_grad is not None
