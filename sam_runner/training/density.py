"""Density estimation as a run (``model=pc``, ``trainer.loss=nll``; docs/circuits.md): the part
that checks the data, logs the training log-likelihood and the exact curvature, and names the
loop that evaluates log-likelihoods in place of accuracy (``circuits.task`` holds the keys)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..circuits.circuit import circuit_of
from ..circuits.task import check_config, check_data, test_values, train_values
from ..part import Part
from .loop import EpochLoop

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from torch import nn

    from ..data import Data
    from ..part import Run
    from .evaluation import EpochStats


class DensityTestSet:
    """The test keys of a density model's evaluation line (``test_ll``, ``test_bpd``,
    ``test_loss``, ``test_nll``); no reliability diagram."""

    reliability = None

    def __init__(self, net: nn.Module, data: Data, num_vars: int) -> None:
        self.net, self.data, self.num_vars = net, data, num_vars

    def log_values(self) -> dict:
        """The test keys of the model being trained."""
        return test_values(self.net, self.data, self.num_vars)

    def measure(self, model: nn.Module) -> dict:
        """The test keys of another model (the averaged weights)."""
        return test_values(model, self.data, self.num_vars)


class DensityLoop(EpochLoop):
    """The epoch loop of a density model: nothing predicted (no accuracy), the test set's
    log-likelihood."""

    def evaluating(self, net: nn.Module) -> None:
        """The test set evaluated by log-likelihood."""
        super().evaluating(net)
        self.test_set = DensityTestSet(net, self.run.data, circuit_of(self.run.model).num_vars)

    def count(self, out: torch.Tensor, labels: torch.Tensor, counts: dict) -> None:  # noqa: ARG002 (the hook's signature)
        """Only the examples counted (nothing is predicted)."""
        counts["targets"] += len(labels)  # the loss's mean is per example

    def end_training_pass(self, stats: EpochStats, started: float) -> bool:
        """The epoch loop's, without a training accuracy."""
        ok = super().end_training_pass(stats, started)
        self.stats.pop("train_acc", None)
        return ok


class DensityPart(Part):
    """``train_ll``, ``hessian_trace_exact`` and ``hessian_trace_depth_<t>`` on every evaluation
    line (the trace on the curvature subset, ``metrics.hessian.num_samples``) and in the summary.
    """

    loop_class = DensityLoop

    def __init__(self, run: Run) -> None:
        self.run, self.circuit = run, circuit_of(run.model)
        check_data(run.data, self.circuit.categories)
        n = int(run.cfg.metrics.get("hessian", {}).get("num_samples", 4096))
        self.subset = run.data.train_subset(n, int(run.cfg.seed))[0]

    def log_values(self) -> dict:
        """``train_ll`` and the exact Hessian traces, on the curvature subset."""
        return train_values(self.circuit, self.run.data, self.subset)

    def summary_values(self, last: dict) -> dict:
        """The last evaluation's ``train_ll`` and traces."""
        keys = ("train_ll", "hessian_trace_exact")
        out = {k: last[k] for k in keys if k in last}
        out.update({k: v for k, v in last.items() if k.startswith("hessian_trace_depth_")})
        return out


def build_part(run: Run) -> DensityPart | None:
    """The density part, for a probabilistic circuit's run (``model=pc``)."""
    return DensityPart(run) if circuit_of(run.model) is not None else None


def check(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """A density run's settings (``circuits.task.check_config``)."""
    check_config(cfg)
