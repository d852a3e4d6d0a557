"""logger=tensorboard: every metrics line's numbers as TensorBoard scalars, and at the end the
summary's numbers (under ``final/``) and the reliability diagram as a figure.

Written with ``torch.utils.tensorboard`` into ``<run folder>/tensorboard/``
(``tensorboard --logdir <sweep or run folder>`` shows every run). The x-axis is the optimizer
``step`` (as W&B's), so mid-epoch curvature lines and epoch lines never share a point; ``epoch``
is a scalar of its own. A resumed run purges what the killed one logged after its checkpoint
(``purge_step``), so no step is drawn twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..registry import LOGGERS
from ..runfiles import finite

if TYPE_CHECKING:
    from omegaconf import DictConfig

FOLDER = "tensorboard"


class TensorBoardLogger:
    run_id = None

    def __init__(self, cfg: DictConfig, run_dir: Path | str) -> None:
        self.dir = Path(run_dir) / FOLDER
        self.flush_secs = int(cfg.get("flush_secs", 30))
        self.writer, self.step, self.resumed_at = None, 0, None

    def state_dict(self) -> dict:
        """The last logged step, for a checkpoint."""
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Take the step a resumed run continues from."""
        self.resumed_at = state.get("step")

    def start(self) -> None:
        """Open the event writer in the run folder's TensorBoard folder."""
        from torch.utils.tensorboard import SummaryWriter

        purge = None if self.resumed_at is None else int(self.resumed_at) + 1
        self.writer = SummaryWriter(str(self.dir), purge_step=purge, flush_secs=self.flush_secs)

    def log(self, row: dict) -> None:
        """A metrics row's finite numbers as scalars at its step."""
        self.step = int(row.get("step", self.step))
        for k, v in row.items():
            if k != "step" and finite(v):
                self.writer.add_scalar(k, v, global_step=self.step)

    def summary(self, summary: dict) -> None:
        """The run's final numbers as ``final/<key>`` scalars, and its reliability diagram when
        there is one."""
        if self.writer is None:
            return
        for k, v in summary.items():
            if finite(v):
                self.writer.add_scalar(f"final/{k}", v, global_step=self.step)
        from ..plots.run import find_reliability, plot_reliability

        bins = find_reliability(summary)
        if bins is not None:
            self.writer.add_figure("reliability", plot_reliability(bins), global_step=self.step)

    def finish(self, _status: str) -> None:
        """Close the event writer."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@LOGGERS.register("tensorboard", "TensorBoard event files in <run>/tensorboard/ (scalars, figure)")
def build(cfg: DictConfig, run_dir: Path | str, _full_cfg: DictConfig) -> TensorBoardLogger:
    """The ``tensorboard`` logger."""
    return TensorBoardLogger(cfg, run_dir)
