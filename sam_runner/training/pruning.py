"""A search trial's pruning as a run part: after each evaluation rank 0 reports
``trainer.objective`` to the trial (``sweep/trial.py``), whose pruner may stop the run there; the
checkpoint of that evaluation stays and the summary says ``pruned``, with where."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..part import Part
from ..settings import objective_key

if TYPE_CHECKING:
    from ..clock import Clock
    from ..part import Run


class TrialPruning(Part):
    """Args:
    trial: the search's trial (``should_stop(epoch, value, last) -> bool``).
    key: the objective's key in a metrics line.
    clock: the run's clock (its planned epochs).
    """

    def __init__(self, trial: Any, key: str | None, clock: Clock) -> None:
        self.trial, self.key, self.clock = trial, key, clock
        self.pruned_at: dict | None = None

    def stop_requested(self, epoch: int, last: dict, final: bool) -> bool:
        """Whether the trial's pruner stops the run at this evaluation (recorded when it does)."""
        value = last.get(self.key)
        if not self.trial.should_stop(epoch, value, final):
            return False
        self.pruned_at = {"pruned_epoch": epoch, "pruned_value": value}
        return True

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        """``status: pruned`` and where, when the run was pruned."""
        if self.pruned_at is None:
            return {}
        return {"status": "pruned", **self.pruned_at, "planned_epochs": self.clock.epochs}


def build_part(run: Run) -> TrialPruning | None:
    """The trial's pruning, for a job of a pruned search (rank 0 holds the trial)."""
    if run.trial is None:
        return None
    return TrialPruning(run.trial, objective_key(run.cfg), run.clock)
