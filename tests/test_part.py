"""The part interface: each hook dispatched to the parts that override it, in the list's order;
the run's list of features declares every part of a run."""

from __future__ import annotations

import torch

from sam_runner.part import HOOKS, Part, Parts, PassInputs
from sam_runner.training.parts import FEATURES


class Adds(Part):
    name = "adds"

    def __init__(self, k):
        self.k, self.seen = k, []

    def loss_term(self, objective, inputs):  # noqa: ARG002 (the hook's signature)
        return objective * 10 + self.k

    def after_step(self, step):
        self.seen.append(step)

    def log_values(self):
        return {"k": self.k, f"k{self.k}": True}


class Quiet(Part):
    pass


def test_hooks_reach_only_the_parts_that_have_them_in_order():
    a, b, q = Adds(1), Adds(2), Quiet()
    parts = Parts([a, q, b])
    inputs = PassInputs(torch.nn.Identity(), torch.zeros(1), torch.zeros(1), 0, 1.0, None)
    assert parts.loss(torch.tensor(0.0), inputs) == (0 * 10 + 1) * 10 + 2  # a's term, then b's
    parts.call("after_step", 7)
    assert a.seen == b.seen == [7]
    assert parts.merged("log_values") == {"k": 2, "k1": True, "k2": True}  # later parts win
    assert len(parts.loss_hooks) == 2 and parts.context_hooks == []
    assert parts.stateful() == {"adds": b}  # by name: the checkpoint's key
    assert parts.batch("x", "y", 0) == ("x", "y") and not parts.any("stop_requested", 1, {}, False)


def test_every_hook_of_the_interface_is_documented():
    assert {"loss_term", "param_groups", "attach", "after_step", "summary_values"} <= set(HOOKS)
    for hook in HOOKS:
        assert getattr(Part, hook).__doc__, hook


def test_the_features_are_built_by_functions_and_checked_by_functions():
    names = [f.name for f in FEATURES]
    assert len(names) == len(set(names))
    # the order the loop relies on: distillation's objective before a regularizer adds to it
    assert names.index("trainer.distill") < names.index("regularizer")
    assert all(callable(f.build) and (f.check is None or callable(f.check)) for f in FEATURES)
