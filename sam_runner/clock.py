"""Where a run is: its epoch and step, its wall time, and whether it is inside an epoch."""

from __future__ import annotations

from dataclasses import dataclass

SAVED = ("epoch", "step", "elapsed", "train_time")


@dataclass
class Clock:
    epochs: int = 1  # the run's length (from its config; not saved)
    epoch: int = 0  # the epoch running, or the last one finished
    step: int = 0  # optimizer steps taken
    elapsed: float = 0.0  # wall seconds since the start, across resumes (as of the last checkpoint)
    train_time: float = 0.0  # of which training (evaluation and curvature measurements excluded)
    within_epoch: bool = False  # between an epoch's first and last step (not saved)
    total_steps: int = 0  # the run's length in steps (from its config; not saved)
    rounds: bool = False  # a federated run: its epochs are rounds (from its config; not saved)

    @property
    def final(self) -> bool:
        """At the end of the last epoch."""
        return not self.within_epoch and self.epoch >= self.epochs

    def state_dict(self) -> dict:
        """The saved fields, for a checkpoint."""
        return {k: getattr(self, k) for k in SAVED}

    def load_state_dict(self, state: dict) -> None:
        """Restore the saved fields from a checkpoint's state."""
        for k in SAVED:
            setattr(self, k, state[k])
