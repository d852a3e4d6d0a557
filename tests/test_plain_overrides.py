"""Plain override lines (``key=value``, ``key=a,b``: words and integers) expand into the jobs
Hydra's grammar and basic sweeper give, without importing the grammar; any other line is left
to the grammar."""

from __future__ import annotations

import pytest

from sam_runner.sweep import hydra_api
from sam_runner.sweep.plan import plain_product, product

PLAIN = [
    [],
    ["trainer.epochs=1", "dataset.num_samples=500", "trainer.progress=none", "seed=0"],
    ["optimizer=sam,asam,base", "seed=0,1", "trainer.epochs=3"],
    ["seed=0,1", "optimizer=sam", "seed=2,3,4", "model=resnet18"],  # the last seed wins, in place
    ["optimizer=gear_sam", "optimizer=sam,sam", "dataset=cifar10"],
    ["x=nullable", "y=Trueish", "z=infinity", "w=nano", "v=_a1,b_2,10"],
]
GRAMMAR_ONLY = [
    "lr=1e-3",  # a float Hydra writes back as 0.001
    "optimizer.rho=0.05,0.1",
    "flag=true",
    "flag=False",
    "x=null",
    "x=NaN",
    "x=inf",
    "seed=range(3)",
    "seed=007",
    "+extra=1",
    "~trainer.epochs",
    "hydra/launcher=basic",
    "x=a,",
    "x='quoted'",
    "x=${y}",
    "x=a b",
]


@pytest.mark.parametrize("lines", PLAIN)
def test_plain_lines_give_the_jobs_of_hydras_grammar_and_basic_sweeper(lines):
    assert plain_product(lines) == product(hydra_api.parse_overrides(lines))


@pytest.mark.parametrize("line", GRAMMAR_ONLY)
def test_any_other_line_is_left_to_hydras_grammar(line):
    assert plain_product(["seed=0,1", line]) is None
