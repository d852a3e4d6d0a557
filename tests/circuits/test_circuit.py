"""The circuit: normalised over every assignment, marginals equal to brute-force sums, the
structure's decomposability and its keys' ranges."""

from __future__ import annotations

import itertools

import pytest
import torch

from sam_runner.circuits.circuit import ProbabilisticCircuit, region_assignment
from sam_runner.errors import UserError


def all_assignments(num_vars: int, categories: int) -> torch.Tensor:
    rows = itertools.product(range(categories), repeat=num_vars)
    return torch.tensor(list(rows), dtype=torch.long)


@pytest.mark.parametrize(
    "num_vars,categories,depth,units,reps",
    [(4, 2, 1, 3, 1), (6, 2, 2, 2, 3), (5, 3, 2, 2, 2), (8, 2, 3, 2, 2)],
)
def test_probabilities_of_every_assignment_sum_to_one(num_vars, categories, depth, units, reps):
    torch.manual_seed(0)
    pc = ProbabilisticCircuit(num_vars, categories, depth, units, reps).double()
    x = all_assignments(num_vars, categories)
    total = torch.logsumexp(pc(x), 0).exp().item()
    assert total == pytest.approx(1.0, abs=1e-12)


def test_marginals_equal_brute_force_sums():
    torch.manual_seed(1)
    pc = ProbabilisticCircuit(6, 3, 2, 3, 2).double()
    x = all_assignments(6, 3)
    joint = pc(x).exp()
    observed = torch.tensor([True, False, True, True, False, False])
    for values in [(0, 1, 2), (2, 2, 0), (1, 0, 1)]:
        match = (x[:, observed] == torch.tensor(values)).all(1)
        brute = joint[match].sum()
        query = torch.zeros(1, 6, dtype=torch.long)
        query[0, observed] = torch.tensor(values)
        got = pc.marginal(query, observed[None]).exp()
        assert got.item() == pytest.approx(brute.item(), rel=1e-12)


def test_every_leaf_region_of_every_repetition_holds_a_part_of_the_variables():
    torch.manual_seed(2)
    regions = region_assignment(11, 3, 4)
    for row in regions:  # each variable in exactly one leaf region; every region non-empty
        counts = torch.bincount(row, minlength=8)
        assert counts.min() >= 1 and counts.sum() == 11 and counts.max() - counts.min() <= 1
    assert len({tuple(r.tolist()) for r in regions}) > 1  # the repetitions differ


def test_the_circuit_is_built_from_the_global_seed():
    torch.manual_seed(3)
    a = ProbabilisticCircuit(10, 2, 2, 2, 2)
    torch.manual_seed(3)
    b = ProbabilisticCircuit(10, 2, 2, 2, 2)
    assert torch.equal(a.leaf_index, b.leaf_index)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(depth=0), "model.depth"),
        (dict(depth=4), "model.depth"),  # 16 leaf regions of 10 variables
        (dict(sum_units=0), "model.sum_units"),
        (dict(repetitions=0), "model.repetitions"),
        (dict(categories=1), "model.categories"),
    ],
)
def test_structure_keys_out_of_range_are_one_line_errors(kwargs, key):
    args = dict(categories=2, depth=2, sum_units=2, repetitions=1) | kwargs
    with pytest.raises(UserError, match=key):
        ProbabilisticCircuit(10, **args)
